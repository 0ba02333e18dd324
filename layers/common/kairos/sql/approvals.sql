-- approvals: approval waits of the tool loop (migration 0012). Written by the run worker (request,
-- applied), the API (approve, deny), the tick (expiry) and a run's cancel (retire).

-- name: approvals_insert
-- A tool call's request for a person's decision, expiring after expires_in seconds (one per call).
INSERT INTO approvals (id, run_id, owner, attempt, step, call_id, tool, args_digest, preview, expires_at,
                       created_at, updated_at)
VALUES (%(id)s, %(run_id)s, %(owner)s, %(attempt)s, %(step)s, %(call_id)s, %(tool)s, %(args_digest)s,
        %(preview)s, coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(expires_in)s),
        coalesce(%(now)s::timestamptz, now()), coalesce(%(now)s::timestamptz, now()))
ON CONFLICT (run_id, step, call_id) DO NOTHING
RETURNING *;

-- name: approvals_for_call
-- The request made for one tool call of a run's step log.
SELECT * FROM approvals WHERE run_id = %(run_id)s AND step = %(step)s AND call_id = %(call_id)s;

-- name: approvals_apply
-- approved -> applied, once: in the transaction that records the approved call's result.
UPDATE approvals
   SET state = 'applied', updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = %(id)s AND state = 'approved'
RETURNING id;

-- name: approvals_decide
-- pending -> approved or denied by its owner, while it has not expired (one decision wins). The row is
-- found and locked by its key alone, then checked: with the owner in the scan, statistics taken before
-- an owner's first requests let the planner read all of them through approvals_owner_idx to find one.
WITH found AS MATERIALIZED (
    SELECT id, owner, state, expires_at FROM approvals WHERE id = %(id)s FOR NO KEY UPDATE
)
UPDATE approvals AS a
   SET state = %(state)s, decided_at = coalesce(%(now)s::timestamptz, now()), decided_by = %(owner)s,
       updated_at = coalesce(%(now)s::timestamptz, now())
  FROM found f
 WHERE a.id = f.id AND f.owner = %(owner)s AND f.state = 'pending'
   AND f.expires_at > coalesce(%(now)s::timestamptz, now())
RETURNING a.*;

-- name: approvals_get
-- One request of one owner, found by its key alone and then checked (see approvals_decide).
WITH found AS MATERIALIZED (SELECT * FROM approvals WHERE id = %(id)s)
SELECT * FROM found WHERE owner = %(owner)s;

-- name: approvals_list
-- The owner's requests, newest first, optionally in one state.
SELECT * FROM approvals
 WHERE owner = %(owner)s AND (%(state)s::text IS NULL OR state = %(state)s)
 ORDER BY created_at DESC, id DESC
 LIMIT %(limit)s;

-- name: approvals_lock_due_runs
-- The runs of pending requests past expires_at, locked first (a bounded batch, skipping held runs): the
-- run row is taken before its request everywhere, as a cancel takes it.
SELECT r.id AS run_id
  FROM approvals a
  JOIN runs r ON r.id = a.run_id
 WHERE a.state = 'pending' AND a.expires_at <= coalesce(%(now)s::timestamptz, now())
   AND a.decided_at IS NULL  -- true of a pending row; lets approvals_pending_expiry_idx serve this (0020)
 ORDER BY a.expires_at
 LIMIT %(limit)s
   FOR NO KEY UPDATE OF r SKIP LOCKED;

-- name: approvals_expire_due
-- pending -> expired for the requests past expires_at of the runs the caller locked.
UPDATE approvals
   SET state = 'expired', decided_at = coalesce(%(now)s::timestamptz, now()),
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE run_id = ANY(%(run_ids)s::uuid[]) AND state = 'pending'
   AND expires_at <= coalesce(%(now)s::timestamptz, now())
RETURNING id, run_id, owner;

-- name: approvals_retire_for_run
-- A cancelled run's open requests are retired (nobody can approve them any more).
UPDATE approvals
   SET state = 'retired', decided_at = coalesce(%(now)s::timestamptz, now()),
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE run_id = %(run_id)s AND state IN ('pending', 'approved')
RETURNING id;

-- name: approvals_ops_list
-- Operators: requests of every owner (or one), newest first, optionally in one state.
SELECT * FROM approvals
 WHERE (%(owner)s::text IS NULL OR owner = %(owner)s) AND (%(state)s::text IS NULL OR state = %(state)s)
 ORDER BY created_at DESC, id DESC
 LIMIT %(limit)s;

-- name: approvals_ops_get
-- Operators: one request whoever owns it.
SELECT * FROM approvals WHERE id = %(id)s;
