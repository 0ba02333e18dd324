-- The tick (kairos.tick): settle ended runs, repair handoffs and expired leases, fire due schedules.
-- "Now" is always coalesce(%(now)s, now()): the database clock decides, tests inject it. Row locks
-- are FOR NO KEY UPDATE (what an UPDATE of non-key columns takes), so foreign-key checks of
-- concurrent inserts (FOR KEY SHARE) never wait on them; SKIP LOCKED splits work between ticks.

-- name: schedules_due_backlog
-- The database clock and the number of active schedules due, for the tick's opening log line.
SELECT coalesce(%(now)s::timestamptz, now()) AS now,
       count(*) AS due
  FROM schedules
 WHERE status = 'active' AND next_fire_at <= coalesce(%(now)s::timestamptz, now());

-- name: schedules_lock_due
-- Locks a batch of due schedules (oldest cursor first, skipping held ones) with their newest active run.
SELECT s.id, s.kind, s.cron, s.interval_seconds, s.starts_at, s.ends_at, s.timezone, s.dst_gap, s.dst_fold,
       s.catch_up, s.overlap, s.revision, s.next_fire_at, s.fire_count, s.max_occurrences, s.conversation_id,
       coalesce(%(now)s::timestamptz, now()) AS db_now,
       CASE WHEN s.overlap <> 'allow' THEN (
           SELECT r.id FROM runs r
            WHERE r.schedule_id = s.id AND r.state IN ('queued', 'running', 'awaiting_approval')
            ORDER BY r.created_at DESC, r.id DESC
            LIMIT 1) END AS active_run_id,
       CASE WHEN s.overlap = 'queue_one' THEN (
           SELECT r.id FROM runs r
            WHERE r.schedule_id = s.id AND r.state = 'queued' AND r.blocked_by_run_id IS NOT NULL
            LIMIT 1) END AS waiting_run_id
  FROM schedules s
 WHERE s.status = 'active'
   AND s.next_fire_at <= coalesce(%(now)s::timestamptz, now())
 ORDER BY s.next_fire_at
 LIMIT %(limit)s
   FOR NO KEY UPDATE OF s SKIP LOCKED;

-- name: schedules_advance_cursor
-- Moves each cursor past now, guarded by the value read; completes schedules with no next fire.
UPDATE schedules AS s
   SET next_fire_at = u.next_fire_at,
       last_fire_at = coalesce(u.last_fire_at, s.last_fire_at),
       fire_count = s.fire_count + u.runs_created,
       status = CASE WHEN u.completed THEN 'completed' ELSE s.status END,
       revision = s.revision + CASE WHEN u.completed THEN 1 ELSE 0 END,
       updated_at = CASE WHEN u.completed THEN coalesce(%(now)s::timestamptz, now()) ELSE s.updated_at END
  FROM jsonb_to_recordset(%(moves)s::jsonb)
       AS u(id uuid, read_next_fire_at timestamptz, next_fire_at timestamptz, last_fire_at timestamptz,
            runs_created integer, completed boolean)
 WHERE s.id = u.id
   AND s.status = 'active'
   AND s.next_fire_at = u.read_next_fire_at
RETURNING s.id;

-- name: occurrences_insert_scheduled
-- Records scheduled occurrences, their queued runs and each run's run.queued event (seq 1), idempotently.
-- A run claimable at once without catch-up expires at fire_at + the schedule's max_delay_seconds; a
-- queued-behind run gets its expiry when it is released (runs_release_blocked).
WITH planned AS (
    SELECT *
      FROM jsonb_to_recordset(%(occurrences)s::jsonb)
           AS p(occurrence_id uuid, schedule_id uuid, fire_at timestamptz, local_time timestamp,
                utc_offset_seconds integer, fold smallint, timezone text, tzdata_version text, revision integer,
                decision text, covers_from timestamptz, covers_until timestamptz, covers_count integer,
                run_id uuid, blocked_by uuid)
), occ AS (
    INSERT INTO occurrences (id, schedule_id, source, fire_at, local_time, utc_offset, fold, timezone,
                             tzdata_version, schedule_revision, decision, covers_from, covers_until,
                             covers_count, created_at)
    SELECT occurrence_id, schedule_id, 'scheduled', fire_at, local_time, make_interval(secs => utc_offset_seconds),
           fold, timezone,
           tzdata_version, revision, decision, covers_from, covers_until, covers_count,
           coalesce(%(now)s::timestamptz, now())
      FROM planned
        ON CONFLICT DO NOTHING
    RETURNING id, schedule_id, decision
), new_runs AS (
    INSERT INTO runs (id, occurrence_id, schedule_id, owner, source, source_conversation_id, mode, prompt,
                      agent, catch_up, state, blocked_by_run_id, expires_at, last_seq, created_at, updated_at)
    SELECT p.run_id, occ.id, s.id, s.owner, 'scheduled', s.conversation_id, s.mode, s.prompt,
           coalesce(s.agent, c.agent), s.catch_up, 'queued', p.blocked_by,
           CASE WHEN NOT s.catch_up AND p.blocked_by IS NULL
                THEN p.fire_at + make_interval(secs => s.max_delay_seconds) END,
           1, coalesce(%(now)s::timestamptz, now()), coalesce(%(now)s::timestamptz, now())
      FROM occ
      JOIN planned p ON p.occurrence_id = occ.id
      JOIN schedules s ON s.id = occ.schedule_id
      JOIN conversations c ON c.id = s.conversation_id
     WHERE p.run_id IS NOT NULL
        ON CONFLICT DO NOTHING
    RETURNING id, occurrence_id, blocked_by_run_id, attempt, fence
), queued_events AS (
    INSERT INTO run_events (run_id, seq, type, at, attempt, fence, data)
    SELECT id, 1, 'run.queued', coalesce(%(now)s::timestamptz, now()), attempt, fence,
           jsonb_strip_nulls(jsonb_build_object('source', 'scheduled', 'occurrence_id', occurrence_id,
                                                'blocked_by_run_id', blocked_by_run_id))
      FROM new_runs
)
SELECT occ.id AS occurrence_id, occ.schedule_id, occ.decision, r.id AS run_id, r.blocked_by_run_id
  FROM occ
  LEFT JOIN new_runs r ON r.occurrence_id = occ.id;

-- name: schedules_pause_by_tick
-- active -> paused for schedules the tick stops (3 failures in a row, a rule that no longer evaluates).
UPDATE schedules
   SET status = 'paused',
       revision = revision + 1,
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = ANY(%(ids)s::uuid[]) AND status = 'active'
RETURNING id, conversation_id, consecutive_failures;

-- name: schedules_lock_unsettled
-- Locks (skipping held ones) the schedules that have ended runs not yet accounted for.
SELECT s.id, s.status, s.consecutive_failures, s.conversation_id
  FROM schedules s
 WHERE s.id IN (SELECT r.schedule_id
                  FROM runs r
                 WHERE r.finished_at IS NOT NULL AND r.settled_at IS NULL
                 ORDER BY r.finished_at
                 LIMIT %(limit)s)
 ORDER BY s.id
   FOR NO KEY UPDATE OF s SKIP LOCKED;

-- name: runs_lock_unsettled
-- The ended, unsettled runs of schedules the caller holds locked, in finished order per schedule.
SELECT id, schedule_id, state, finished_at
  FROM runs
 WHERE schedule_id = ANY(%(schedule_ids)s::uuid[])
   AND finished_at IS NOT NULL AND settled_at IS NULL
 ORDER BY schedule_id, finished_at, id
   FOR NO KEY UPDATE;

-- name: runs_mark_settled
-- Marks ended runs as accounted for; each run is settled once.
UPDATE runs
   SET settled_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = ANY(%(ids)s::uuid[]) AND finished_at IS NOT NULL AND settled_at IS NULL
RETURNING id;

-- name: schedules_set_failures
-- Writes the consecutive failure counts computed by the settle step for schedules it holds locked.
UPDATE schedules AS s
   SET consecutive_failures = u.failures
  FROM unnest(%(ids)s::uuid[], %(failures)s::integer[]) AS u(id, failures)
 WHERE s.id = u.id AND s.consecutive_failures IS DISTINCT FROM u.failures;

-- name: runs_release_blocked
-- queue_one: unblocks queued runs whose blocker has ended, so they can be handed to SQS. A scheduled
-- run without catch-up becomes claimable here, so its expiry is set here: fire_at + max_delay_seconds
-- (a run that waited behind a long blocker is not delivered late either).
UPDATE runs AS r
   SET blocked_by_run_id = NULL,
       expires_at = CASE WHEN r.source = 'scheduled' AND NOT r.catch_up
                         THEN o.fire_at + make_interval(secs => s.max_delay_seconds) END,
       updated_at = coalesce(%(now)s::timestamptz, now())
  FROM occurrences o, schedules s
 WHERE r.id IN (SELECT w.id
                  FROM runs w
                  JOIN runs b ON b.id = w.blocked_by_run_id
                 WHERE w.state = 'queued' AND w.blocked_by_run_id IS NOT NULL AND b.finished_at IS NOT NULL
                 LIMIT %(limit)s
                   FOR NO KEY UPDATE OF w SKIP LOCKED)
   AND r.state = 'queued'
   AND o.id = r.occurrence_id
   AND s.id = r.schedule_id
RETURNING r.id;

-- name: runs_lock_unsent
-- Locks queued, unblocked runs whose handoff never happened (and are not fresh) or is stale.
SELECT id, unclaimed_handoffs
  FROM runs
 WHERE state = 'queued'
   AND blocked_by_run_id IS NULL
   AND ((handoff_at IS NULL
         AND created_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(fresh_seconds)s))
        OR handoff_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(stale_seconds)s))
 ORDER BY handoff_at NULLS FIRST, created_at
 LIMIT %(limit)s
   FOR NO KEY UPDATE SKIP LOCKED;

-- name: runs_fail_undeliverable
-- queued -> failed (undeliverable): a run the caller holds locked that SQS accepted that many times
-- since its last claim with no worker claiming it; a failure like any other for the settle step.
UPDATE runs
   SET last_seq = last_seq + jsonb_array_length(%(events)s::jsonb),
       state = 'failed',
       diagnosis = %(diagnosis)s,
       finished_at = coalesce(%(now)s::timestamptz, now()),
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = %(id)s AND state = 'queued' AND unclaimed_handoffs >= %(handoffs)s
RETURNING id, last_seq, attempt, fence, schedule_id, unclaimed_handoffs;

-- name: runs_lock_expired
-- Locks running runs whose lease expired (their worker is presumed gone) for the rescue.
SELECT id, schedule_id, source, catch_up, restarts, fence, attempt, cancel_requested_at
  FROM runs
 WHERE state = 'running'
   AND lease_expires_at < coalesce(%(now)s::timestamptz, now())
 ORDER BY lease_expires_at
 LIMIT %(limit)s
   FOR NO KEY UPDATE SKIP LOCKED;

-- name: effects_close_vanished
-- Closes effects a vanished worker left reserved: mutations become ambiguous, others failed.
UPDATE effects
   SET state = CASE WHEN mutation THEN 'ambiguous' ELSE 'failed' END,
       error_code = 'lease_lost',
       settled_at = coalesce(%(now)s::timestamptz, now())
 WHERE run_id = ANY(%(run_ids)s::uuid[]) AND state = 'reserved'
RETURNING run_id, state;

-- name: effects_unreplayable_runs
-- The runs among these with a mutation that may have reached the outside world (never replayed).
SELECT DISTINCT run_id
  FROM effects
 WHERE run_id = ANY(%(run_ids)s::uuid[]) AND mutation AND state <> 'failed';

-- name: runs_requeue_rescued
-- running -> queued after an expired lease: restarts + 1, lease cleared, handoff to be redone.
UPDATE runs
   SET state = 'queued',
       lease_token = NULL,
       lease_expires_at = NULL,
       restarts = restarts + 1,
       handoff_at = NULL,
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = %(id)s AND state = 'running' AND fence = %(fence)s
   AND lease_expires_at < coalesce(%(now)s::timestamptz, now())
RETURNING id, restarts;

-- name: runs_end_rescued
-- running -> abandoned, failed or cancelled after an expired lease, with its diagnosis.
UPDATE runs
   SET state = %(state)s,
       diagnosis = %(diagnosis)s,
       lease_token = NULL,
       lease_expires_at = NULL,
       finished_at = coalesce(%(now)s::timestamptz, now()),
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = %(id)s AND state = 'running' AND fence = %(fence)s
   AND lease_expires_at < coalesce(%(now)s::timestamptz, now())
RETURNING id;
