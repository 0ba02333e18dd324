-- Schedule definitions (kairos.schedules): create, read, and the API's state moves. Every edit is
-- one guarded UPDATE that bumps revision and updated_at; zero rows tells the caller the schedule is
-- missing, foreign, or in a state that does not allow the move.

-- name: schedules_clock
-- The instant schedule decisions use: the injected now, else the database clock.
SELECT coalesce(%(now)s::timestamptz, now()) AS now;

-- name: schedules_insert
-- Creates one schedule; the caller holds the conversation lock and has counted its schedules.
INSERT INTO schedules (
    id, owner, conversation_id, name, prompt, kind, cron, interval_seconds, starts_at, ends_at,
    max_occurrences, timezone, dst_gap, dst_fold, mode, catch_up, max_delay_seconds, overlap, agent, signing,
    next_fire_at, token_hash, created_by_run_id, created_at, updated_at
) VALUES (
    %(id)s, %(owner)s, %(conversation_id)s, %(name)s, %(prompt)s, %(kind)s, %(cron)s, %(interval_seconds)s,
    %(starts_at)s, %(ends_at)s, %(max_occurrences)s, %(timezone)s, %(dst_gap)s, %(dst_fold)s, %(mode)s,
    %(catch_up)s, %(max_delay_seconds)s, %(overlap)s, %(agent)s, %(signing)s, %(next_fire_at)s, %(token_hash)s,
    %(created_by_run_id)s, coalesce(%(now)s::timestamptz, now()), coalesce(%(now)s::timestamptz, now())
)
RETURNING *;

-- name: schedules_get
-- One schedule of one owner; a foreign schedule answers like a missing one.
SELECT * FROM schedules WHERE id = %(schedule_id)s AND owner = %(owner)s;

-- name: schedules_list
-- The owner's schedules that are not cancelled, optionally of one conversation, oldest first.
SELECT *
  FROM schedules
 WHERE owner = %(owner)s
   AND (%(conversation_id)s::uuid IS NULL OR conversation_id = %(conversation_id)s::uuid)
   AND status <> 'cancelled'
 ORDER BY created_at, id;

-- name: schedules_count_open
-- Schedules of a conversation that still count against its limit (not cancelled, not completed).
SELECT count(*) AS open FROM schedules WHERE conversation_id = %(conversation_id)s AND status IN ('active', 'paused');

-- name: schedules_pause
-- active -> paused (the API). The cursor is kept; resume recomputes it.
UPDATE schedules
   SET status = 'paused',
       revision = revision + 1,
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = %(schedule_id)s AND owner = %(owner)s AND status = 'active'
RETURNING *;

-- name: schedules_resume
-- paused -> active with no failures and the next fire computed from now, for the revision read.
UPDATE schedules
   SET status = 'active',
       consecutive_failures = 0,
       next_fire_at = %(next_fire_at)s::timestamptz,
       revision = revision + 1,
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = %(schedule_id)s AND owner = %(owner)s AND status = 'paused' AND revision = %(revision)s
RETURNING *;

-- name: schedules_cancel
-- active or paused -> cancelled (final). The cursor is cleared; runs already claimed still finish.
UPDATE schedules
   SET status = 'cancelled',
       next_fire_at = NULL,
       revision = revision + 1,
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = %(schedule_id)s AND owner = %(owner)s AND status IN ('active', 'paused')
RETURNING *;
