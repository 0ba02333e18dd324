-- input_requests: a goal loop run's questions to its owner (migration 0015). Written by the run worker
-- (ask), the API (answer) and a cancel of the run or the loop, or a goal edit (cancel). Every decision
-- is one guarded UPDATE from pending: one wins.

-- name: input_requests_insert
-- A loop run's question (one per tool call; at most one pending per run).
INSERT INTO input_requests (id, owner, run_id, attempt, step, call_id, schedule_id, revision, conversation_id,
                            question, question_digest, created_at, updated_at)
VALUES (%(id)s, %(owner)s, %(run_id)s, %(attempt)s, %(step)s, %(call_id)s, %(schedule_id)s, %(revision)s,
        %(conversation_id)s, %(question)s, %(question_digest)s, coalesce(%(now)s::timestamptz, now()),
        coalesce(%(now)s::timestamptz, now()))
ON CONFLICT (run_id, step, call_id) DO NOTHING
RETURNING *;

-- name: input_requests_for_call
-- The request one tool call of a run's step log made.
SELECT * FROM input_requests WHERE run_id = %(run_id)s AND step = %(step)s AND call_id = %(call_id)s;

-- name: input_requests_get
-- One request of one owner; a foreign one answers like a missing one. Found by its key alone and then
-- checked: with the owner in the scan, statistics taken before an owner's first requests let the
-- planner read all of them through input_requests_owner_idx to find one.
WITH found AS MATERIALIZED (SELECT * FROM input_requests WHERE id = %(id)s)
SELECT * FROM found WHERE owner = %(owner)s;

-- name: input_requests_list
-- The owner's requests, newest first, optionally in one state.
SELECT * FROM input_requests
 WHERE owner = %(owner)s AND (%(state)s::text IS NULL OR state = %(state)s)
 ORDER BY created_at DESC, id DESC
 LIMIT %(limit)s;

-- name: input_requests_answer
-- pending -> answered by its owner, once: the answer's digest and the thread entry that holds it. The
-- row is found and locked by its key alone, then checked (see input_requests_get).
WITH found AS MATERIALIZED (
    SELECT id, owner, state FROM input_requests WHERE id = %(id)s FOR NO KEY UPDATE
)
UPDATE input_requests AS i
   SET state = 'answered', answer_digest = %(answer_digest)s, answer_entry_seq = %(entry_seq)s,
       decided_at = coalesce(%(now)s::timestamptz, now()), updated_at = coalesce(%(now)s::timestamptz, now())
  FROM found f
 WHERE i.id = f.id AND f.owner = %(owner)s AND f.state = 'pending'
RETURNING i.*;

-- name: input_requests_cancel_for_run
-- A cancelled run's pending request is cancelled (nobody can answer it any more).
UPDATE input_requests
   SET state = 'cancelled', decided_at = coalesce(%(now)s::timestamptz, now()),
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE run_id = %(run_id)s AND state = 'pending'
RETURNING id, run_id;

-- name: input_requests_lock_waiting_runs
-- The runs waiting on one owner's loop's pending requests, locked (in id order) before the loop is: a
-- run first, then its loop, as the run's worker takes them (a goal report locks the loop under its run).
SELECT r.id
  FROM runs r
 WHERE r.id IN (SELECT q.run_id FROM input_requests q
                 WHERE q.schedule_id = %(schedule_id)s AND q.owner = %(owner)s AND q.state = 'pending')
 ORDER BY r.id
   FOR NO KEY UPDATE OF r;

-- name: input_requests_pending_for_schedule
-- A loop's pending requests (its cancel or goal edit cancels them, each run locked first).
SELECT id, run_id FROM input_requests WHERE schedule_id = %(schedule_id)s AND state = 'pending' ORDER BY created_at;

-- name: input_requests_ops_list
-- Operators: requests of every owner (or one), newest first, optionally in one state.
SELECT * FROM input_requests
 WHERE (%(owner)s::text IS NULL OR owner = %(owner)s) AND (%(state)s::text IS NULL OR state = %(state)s)
 ORDER BY created_at DESC, id DESC
 LIMIT %(limit)s;

-- name: input_requests_ops_get
-- Operators: one request whoever owns it.
SELECT * FROM input_requests WHERE id = %(id)s;
