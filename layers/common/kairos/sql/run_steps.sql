-- run_steps: the tool loop's step log (migration 0012). Written by the run worker under its fence, in
-- the transaction that settles the step's effect; read by a later attempt to fold what was done.

-- name: run_steps_list
-- A run's completed steps in order.
SELECT n, kind, name, call_id, record FROM run_steps WHERE run_id = %(run_id)s ORDER BY n;

-- name: run_steps_record
-- Records one completed step for the current fence holder (zero rows: the fence moved on).
INSERT INTO run_steps (run_id, n, kind, name, call_id, record, attempt, fence, created_at)
SELECT r.id, %(n)s, %(kind)s, %(name)s, %(call_id)s, %(record)s, r.attempt, r.fence,
       coalesce(%(now)s::timestamptz, now())
  FROM runs r
 WHERE r.id = %(run_id)s AND r.fence = %(fence)s AND r.state = 'running'
RETURNING n;
