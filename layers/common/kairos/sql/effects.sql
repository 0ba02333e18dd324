-- The effects ledger (kairos.effects): one row per external call, reserved under the run's fence
-- before the call and closed after it. Every statement here checks and locks the run row first
-- (the `authority` CTE), so a worker that lost its lease reserves and settles nothing.

-- name: effects_reserve
-- Reserves one external effect for the current fence holder (zero rows when the fence is stale).
INSERT INTO effects (id, run_id, fence, attempt, step, kind, mutation, target, request_digest, created_at)
SELECT gen_random_uuid(), r.id, r.fence, r.attempt, %(step)s, %(kind)s, %(mutation)s, %(target)s, %(digest)s,
       coalesce(%(now)s::timestamptz, now())
  FROM runs r
 WHERE r.id = %(run_id)s AND r.fence = %(fence)s AND r.attempt = %(attempt)s AND r.state = 'running'
   FOR NO KEY UPDATE OF r
RETURNING *;

-- name: effects_close
-- Moves one reserved effect of the fence holder to settled, failed or ambiguous.
WITH authority AS (
    SELECT id FROM runs
     WHERE id = %(run_id)s AND fence = %(fence)s AND state = 'running'
       FOR NO KEY UPDATE
)
UPDATE effects e
   SET state = %(state)s,
       usage = %(usage)s,
       error_code = %(error_code)s,
       settled_at = coalesce(%(now)s::timestamptz, now())
  FROM authority a
 WHERE e.id = %(effect_id)s AND e.run_id = a.id AND e.fence = %(fence)s AND e.state = 'reserved'
RETURNING e.*;

-- name: effects_close_stale
-- On a new claim: effects left reserved by an earlier fence become ambiguous (mutations) or failed.
WITH authority AS (
    SELECT id FROM runs
     WHERE id = %(run_id)s AND fence = %(fence)s AND state = 'running'
       FOR NO KEY UPDATE
)
UPDATE effects e
   SET state = CASE WHEN e.mutation THEN 'ambiguous' ELSE 'failed' END,
       error_code = 'lease_lost',
       settled_at = coalesce(%(now)s::timestamptz, now())
  FROM authority a
 WHERE e.run_id = a.id AND e.fence < %(fence)s AND e.state = 'reserved'
RETURNING e.*;

-- name: effects_replay_blockers
-- Mutations that may have reached the outside world: while one exists the run is never replayed.
SELECT * FROM effects
 WHERE run_id = %(run_id)s AND mutation AND state <> 'failed'
 ORDER BY created_at, id;

-- name: effects_list_for_run
-- Every effect of one run, oldest first.
SELECT * FROM effects WHERE run_id = %(run_id)s ORDER BY created_at, fence, step;
