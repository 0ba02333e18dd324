-- Jitter (docs/architecture.md "Jitter"): a timed schedule may spread its fires over `jitter_seconds`
-- (0..3600; the API also keeps it at most half the rule's shortest period). Each fire is dispatched at
-- its nominal instant plus an offset derived from the fire's identity — the schedule id and the
-- nominal instant, the two things its deterministic occurrence id is made of — so every tick, retried
-- or concurrent, computes the same offset. The nominal instant stays `next_fire_at` / `fire_at`; the
-- instant the fire is due for dispatch is `next_dispatch_at` / `dispatch_at`.

ALTER TABLE schedules ADD COLUMN jitter_seconds integer NOT NULL DEFAULT 0
    CONSTRAINT schedules_jitter_bounds CHECK (jitter_seconds BETWEEN 0 AND 3600);

-- The offset of one fire, uniform in [0, jitter]: the first 48 bits of SHA-256(schedule id's 16 bytes
-- || the nominal instant as big-endian microseconds since the Unix epoch), mod jitter + 1.
-- kairos.identity.dispatch_offset computes the same number (tests/db/test_jitter.py holds them equal).
-- plpgsql, so that the planner never inlines it into the generated column below (extract on a
-- timestamptz is STABLE in general; the epoch it reads here does not depend on the session's zone).
CREATE FUNCTION kairos_dispatch_at(schedule_id uuid, fire_at timestamptz, jitter integer) RETURNS timestamptz
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
BEGIN
    IF jitter <= 0 THEN
        RETURN fire_at;
    END IF;
    RETURN fire_at + make_interval(secs => (('x' || encode(substring(
               sha256(uuid_send(schedule_id) || int8send((extract(epoch FROM fire_at) * 1000000)::bigint))
               FROM 1 FOR 6), 'hex'))::bit(48)::bigint % (jitter + 1)));
END
$$;

-- The tick's due key: the cursor's dispatch instant, kept by the database itself, so every statement
-- that moves next_fire_at (create, edit, resume, a loop's moves, the tick's cursor) keeps it true.
ALTER TABLE schedules ADD COLUMN next_dispatch_at timestamptz
    GENERATED ALWAYS AS (kairos_dispatch_at(id, next_fire_at, jitter_seconds)) STORED;

-- The due scans read next_dispatch_at now; the cursor index moves to it (same predicate device as 0020).
DROP INDEX schedules_due_key_idx;
CREATE INDEX schedules_due_key_idx ON schedules (next_dispatch_at, id)
    WHERE status = 'active' AND next_dispatch_at IS NOT NULL;

-- The dispatch instant is state, like the cursor: a revision's definition leaves it out (jitter_seconds
-- is part of the definition).
CREATE OR REPLACE FUNCTION kairos_schedule_definition(s schedules) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT to_jsonb(s) - ARRAY['id', 'owner', 'conversation_id', 'status', 'revision', 'next_fire_at',
                               'next_dispatch_at', 'last_fire_at', 'fire_count', 'consecutive_failures',
                               'token_hash', 'previous_token_hash', 'previous_token_expires_at',
                               'created_by_run_id', 'created_at', 'updated_at', 'input_run_id']
$$;

-- The instant an occurrence was due for dispatch (fire_at + its offset; fire_at for unjittered and
-- untimed sources). Lateness and a scheduled run's expiry count from it. NULL only on occurrences
-- recorded before this migration, which read as fire_at.
ALTER TABLE occurrences ADD COLUMN dispatch_at timestamptz;
