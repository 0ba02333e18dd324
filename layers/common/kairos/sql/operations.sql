-- name: schedules_ops_list
-- Operators: schedules of every owner (or one), not cancelled unless asked, oldest first.
SELECT * FROM schedules
 WHERE (%(owner)s::text IS NULL OR owner = %(owner)s)
   AND (%(all)s OR status <> 'cancelled')
 ORDER BY created_at, id
 LIMIT %(limit)s;

-- name: schedules_ops_get
-- Operators: one schedule whoever owns it.
SELECT * FROM schedules WHERE id = %(id)s;

-- name: runs_ops_list
-- Operators: the newest runs, optionally of one schedule or in one state.
SELECT * FROM runs
 WHERE (%(schedule_id)s::uuid IS NULL OR schedule_id = %(schedule_id)s)
   AND (%(state)s::text IS NULL OR state = %(state)s)
 ORDER BY created_at DESC, id
 LIMIT %(limit)s;

-- name: runs_ops_get
-- Operators: one run whoever owns it.
SELECT * FROM runs WHERE id = %(id)s;

-- name: runs_ops_events
-- Operators: a run's whole trace in order (progress included).
SELECT seq, type, at, attempt, fence, step, data FROM run_events WHERE run_id = %(id)s ORDER BY seq;

-- name: schedules_ops_status
-- Operators: the due backlog (active timed schedules whose next fire has passed) and its oldest fire.
SELECT count(*) AS due,
       min(next_fire_at) AS oldest_due_at,
       coalesce(%(now)s::timestamptz, now()) AS now
  FROM schedules
 WHERE status = 'active' AND next_fire_at <= coalesce(%(now)s::timestamptz, now());

-- name: runs_ops_status
-- Operators: queued and running counts, the oldest queued run, runs whose lease expired, and queued
-- runs whose handoff never happened or is stale (the tick's repair picks both up).
SELECT count(*) FILTER (WHERE state = 'queued') AS queued,
       count(*) FILTER (WHERE state = 'running') AS running,
       min(created_at) FILTER (WHERE state = 'queued') AS oldest_queued_at,
       count(*) FILTER (WHERE state = 'running' AND lease_expires_at < coalesce(%(now)s::timestamptz, now()))
           AS lease_expired,
       count(*) FILTER (WHERE state = 'queued' AND blocked_by_run_id IS NULL AND (handoff_at IS NULL
           OR handoff_at < coalesce(%(now)s::timestamptz, now()) - interval '15 minutes')) AS handoff_pending
  FROM runs
 WHERE state IN ('queued', 'running');
