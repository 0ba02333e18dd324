-- One owner's run ends no longer queue on its slot lock (kairos.budgets, "Slots"). Before, the statement
-- that ends or parks a run holding a slot (the trigger of migration 0030) took the owner's slot lock
-- exclusively and held it to its commit, even when nothing of the owner waited: one owner's ends ran
-- one at a time, each waiting for the previous one's commit (its WAL flush), so a big tenant's runs
-- ended through one lock and never shared a flush.
--
-- Now an end takes the owner's slot lock SHARED. Every count that hands out or takes a slot (a release,
-- kairos_release_slots; the claim of a run nobody released, runs_hold_owner_slots) still takes it
-- exclusively, so it waits for every end in progress to commit and then sees those slots free, and an
-- end that starts meanwhile waits for it. Ends of one owner no longer wait for each other: under the
-- shared lock an end looks (a fresh snapshot, after the lock) for the owner's waiting runs; with none,
-- it is done. With some, it hands its slot out as before, serialized with the owner's other handing-out
-- ends by a second lock ('kairos.owner_slot_ends:'), always taken after the first, so no two of them
-- count at once. Why no waiting run is left beside a free slot:
-- * a run that starts waiting is committed by an intake (or a requeue, a resume) whose own release
--   comes after it and takes the exclusive lock: it waits for every end in progress, then counts their
--   slots free and admits the run;
-- * an end whose look found nothing waiting holds the shared lock from before that look to its commit,
--   so no release counts in between; an end that found runs waiting counts under the second lock, and
--   an end it counts as still holding its slot (not yet committed) either found nothing waiting —
--   then the waiting run was committed after that end's look and its intake's release comes after
--   both — or found it too and counts next, after this one committed;
-- * a held run (held_until ahead) that becomes due by time alone, with no commit, would break the first
--   point: the look counts held runs as waiting (the release still passes them by until due).

-- The owner's waiting runs into its free slots, oldest first (the body of kairos_release_slots, 0032):
-- the caller holds what makes its counts exact (the owner's slot lock exclusively, or shared with the
-- ends' second lock).
CREATE FUNCTION kairos_admit_waiting(p_owner text, p_released_by uuid, p_now timestamptz)
RETURNS SETOF uuid LANGUAGE plpgsql AS $$
DECLARE
    v_held integer;
    v_limit integer;
BEGIN
    SELECT w.slot_limit INTO v_limit
      FROM runs w
     WHERE w.owner = p_owner AND w.state = 'queued' AND w.admitted_at IS NULL
       AND w.blocked_by_run_id IS NULL AND w.paused_at IS NULL
       AND (w.held_until IS NULL OR w.held_until <= coalesce(p_now, now()))
     ORDER BY w.created_at, w.id
     LIMIT 1;
    IF v_limit IS NULL THEN
        RETURN;  -- nothing waits
    END IF;
    SELECT count(*) INTO v_held
      FROM runs h
     WHERE h.owner = p_owner AND (h.state = 'running' OR h.admitted_at IS NOT NULL);
    IF v_held >= v_limit THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH holders AS (
        SELECT h.schedule_id, h.concurrency_key
          FROM runs h
         WHERE h.owner = p_owner AND (h.state = 'running' OR h.admitted_at IS NOT NULL)
           AND h.concurrency_key IS NOT NULL
    ), candidates AS (
        SELECT w.id, w.schedule_id, w.concurrency_key, w.concurrency_limit, w.created_at
          FROM runs w
         WHERE w.owner = p_owner AND w.state = 'queued' AND w.admitted_at IS NULL
           AND w.blocked_by_run_id IS NULL AND w.paused_at IS NULL
           AND (w.held_until IS NULL OR w.held_until <= coalesce(p_now, now()))
         ORDER BY w.created_at, w.id
         LIMIT 100
    ), ranked AS (
        SELECT c.id, c.created_at,
               c.concurrency_key IS NULL
               OR row_number() OVER (PARTITION BY c.schedule_id, c.concurrency_key ORDER BY c.created_at, c.id)
                  + (SELECT count(*) FROM holders h
                      WHERE h.schedule_id = c.schedule_id AND h.concurrency_key = c.concurrency_key)
                  <= c.concurrency_limit AS fits
          FROM candidates c
    ), chosen AS (
        SELECT r.id FROM ranked r WHERE r.fits ORDER BY r.created_at, r.id LIMIT v_limit - v_held
    ), admitted AS (
        UPDATE runs u
           SET admitted_at = coalesce(p_now, now()),
               released_by = p_released_by,
               updated_at = coalesce(p_now, now())
          FROM chosen
         WHERE u.id = chosen.id AND u.state = 'queued' AND u.admitted_at IS NULL
           AND u.blocked_by_run_id IS NULL AND u.paused_at IS NULL
           AND (u.held_until IS NULL OR u.held_until <= coalesce(p_now, now()))
        RETURNING u.id
    )
    SELECT a.id FROM admitted a;
END;
$$;

-- A release: the owner's slot lock, exclusively (every end in progress commits first), to the end of
-- the caller's transaction; then the admission. Each query of a plpgsql function takes a new snapshot,
-- so the counts see whatever the lock waited for.
CREATE OR REPLACE FUNCTION kairos_release_slots(p_owner text, p_released_by uuid, p_now timestamptz)
RETURNS SETOF uuid LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('kairos.owner_slots:' || p_owner, 0));
    RETURN QUERY SELECT * FROM kairos_admit_waiting(p_owner, p_released_by, p_now);
END;
$$;

-- An end (or a parking) of a run holding a slot: the slot lock shared; the admission only when
-- something of the owner waits (held runs included), under the ends' second lock.
CREATE OR REPLACE FUNCTION kairos_runs_release_slot() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(hashtextextended('kairos.owner_slots:' || NEW.owner, 0));
    IF EXISTS (SELECT 1 FROM runs w
                WHERE w.owner = NEW.owner AND w.state = 'queued' AND w.admitted_at IS NULL
                  AND w.blocked_by_run_id IS NULL AND w.paused_at IS NULL) THEN
        PERFORM pg_advisory_xact_lock(hashtextextended('kairos.owner_slot_ends:' || NEW.owner, 0));
        PERFORM kairos_admit_waiting(NEW.owner, NEW.id, NULL);
    END IF;
    RETURN NULL;
END;
$$;
