-- run_steps: the record of every model turn and tool call of a run (migrations 0012, 0025). Written by
-- the run worker under its fence, in the transactions that reserve and settle each step's effect
-- (kairos.runs.steps); read by a later attempt to fold the completed steps, and by the owner through
-- GET /v1/runs/{id}/steps. Every write joins the run row and requires its fence and running state.

-- name: run_steps_list
-- A run's steps in order, with what a later attempt folds (the record of the succeeded ones).
SELECT n, kind, name, call_id, record, state FROM run_steps WHERE run_id = %(run_id)s ORDER BY n;

-- name: run_steps_page
-- A page of a run's steps after step number %(after)s (the caller checked the run's owner).
SELECT n, attempt, kind, name, state, started_at, finished_at, input, output, target, usage, effect_id, pruned_at
  FROM run_steps
 WHERE run_id = %(run_id)s AND n > %(after)s
 ORDER BY n
 LIMIT %(limit)s;

-- name: run_steps_begin
-- Opens step n (running, or waiting_approval for a call parked for a person) for the current fence
-- holder; a step parked for approval is reopened by the attempt that applies it. Zero rows: the fence
-- moved on (or the step already ended).
INSERT INTO run_steps (run_id, n, kind, name, call_id, attempt, fence, state, started_at, input, target,
                       effect_id, created_at)
SELECT r.id, %(n)s, %(kind)s, %(name)s, %(call_id)s, r.attempt, r.fence, %(state)s,
       coalesce(%(now)s::timestamptz, now()), %(input)s, %(target)s, %(effect_id)s,
       coalesce(%(now)s::timestamptz, now())
  FROM runs r
 WHERE r.id = %(run_id)s AND r.fence = %(fence)s AND r.state = 'running'
ON CONFLICT (run_id, n) DO UPDATE
   SET state = excluded.state, attempt = excluded.attempt, fence = excluded.fence,
       started_at = excluded.started_at, input = coalesce(excluded.input, run_steps.input),
       target = coalesce(excluded.target, run_steps.target), effect_id = excluded.effect_id
 WHERE run_steps.state = 'waiting_approval'
RETURNING n;

-- name: run_steps_progress
-- Grows a running step's output preview (a streamed model answer) for the current fence holder.
UPDATE run_steps s
   SET output = %(output)s
  FROM runs r
 WHERE s.run_id = %(run_id)s AND s.n = %(n)s AND s.state = 'running'
   AND r.id = s.run_id AND r.fence = %(fence)s AND r.state = 'running'
RETURNING s.n;

-- name: run_steps_finish (prepared)
-- Ends step n for the current fence holder: a step opened by run_steps_begin (running or parked) moves
-- to its end state; a step not opened before (a refused or local tool call, a run's single model call)
-- is written ended at once, started when its effect was reserved (or now, with no effect).
-- With answered, the step whose answer is being published (kairos.execution.execute, publish): only
-- while no cancel is requested — sent behind the run's lock in the publishing trip, it writes exactly
-- when the answer does (a cancelled run's step is closed by its cancel instead).
-- Zero rows: the fence moved on, the step had already ended, or (answered) a cancel was requested.
INSERT INTO run_steps (run_id, n, kind, name, call_id, record, attempt, fence, state, started_at, finished_at,
                       input, output, target, usage, effect_id, created_at)
SELECT r.id, %(n)s, %(kind)s, %(name)s, %(call_id)s, %(record)s, r.attempt, r.fence, %(state)s,
       coalesce((SELECT e.created_at FROM effects e WHERE e.id = %(effect_id)s AND e.run_id = r.id),
                coalesce(%(now)s::timestamptz, now())),
       coalesce(%(now)s::timestamptz, now()), %(input)s, %(output)s,
       %(target)s, %(usage)s, %(effect_id)s, coalesce(%(now)s::timestamptz, now())
  FROM runs r
 WHERE r.id = %(run_id)s AND r.fence = %(fence)s AND r.state = 'running'
   AND (NOT %(answered)s::boolean OR r.cancel_requested_at IS NULL)
ON CONFLICT (run_id, n) DO UPDATE
   SET state = excluded.state, record = excluded.record, attempt = excluded.attempt, fence = excluded.fence,
       finished_at = excluded.finished_at, input = coalesce(excluded.input, run_steps.input),
       output = excluded.output, target = coalesce(excluded.target, run_steps.target), usage = excluded.usage,
       effect_id = coalesce(excluded.effect_id, run_steps.effect_id)
 WHERE run_steps.state IN ('running', 'waiting_approval')
RETURNING n;

-- name: run_steps_close_open
-- Ends the run's steps still running when its attempt ends without them (a failure, a cancel, a lost
-- attempt found by the next one): ambiguous when the step's effect is (or is a mutation still
-- reserved: it may have been applied), else failed. Fenced.
UPDATE run_steps s
   SET state = CASE WHEN EXISTS (SELECT 1 FROM effects e WHERE e.id = s.effect_id AND (
                        e.state = 'ambiguous' OR (e.state = 'reserved' AND e.mutation)))
                    THEN 'ambiguous' ELSE 'failed' END,
       finished_at = coalesce(%(now)s::timestamptz, now())
  FROM runs r
 WHERE s.run_id = %(run_id)s AND s.state = 'running'
   AND r.id = s.run_id AND r.fence = %(fence)s AND r.state = 'running'
RETURNING s.n;

-- name: run_steps_end_with_run
-- Ends the steps a run left running or waiting for a person when it ended without its worker (the
-- tick's rescue of an expired lease, a cancel while it waited): ambiguous when the step's effect is
-- (or is a mutation still reserved), else failed. Only for a run that has ended (finished_at set);
-- the caller ended it in this transaction.
UPDATE run_steps s
   SET state = CASE WHEN EXISTS (SELECT 1 FROM effects e WHERE e.id = s.effect_id AND (
                        e.state = 'ambiguous' OR (e.state = 'reserved' AND e.mutation)))
                    THEN 'ambiguous' ELSE 'failed' END,
       finished_at = coalesce(%(now)s::timestamptz, now())
  FROM runs r
 WHERE s.run_id = %(run_id)s AND s.state IN ('running', 'waiting_approval')
   AND r.id = s.run_id AND r.finished_at IS NOT NULL
RETURNING s.n;

-- name: run_steps_close_waiting
-- Ends a run's step parked for a person when the request is decided against it (denied) or lapses
-- (failed); the approvals module calls it in the transaction that blocks the run.
UPDATE run_steps
   SET state = %(state)s, finished_at = coalesce(%(now)s::timestamptz, now())
 WHERE run_id = %(run_id)s AND state = 'waiting_approval'
RETURNING n;

-- name: run_steps_seed
-- A retry from the last step: copies the old run's completed steps (those a later attempt would fold:
-- succeeded or not_sent_test, record kept) into the new run's log, with their previews (attempt and
-- fence 0: before any claim; no usage or effect: the new run paid for none of them), while the new run
-- is still unclaimed and has no steps of its own.
INSERT INTO run_steps (run_id, n, kind, name, call_id, record, attempt, fence, state, started_at, finished_at,
                       input, output, target, created_at)
SELECT r.id, s.n, s.kind, s.name, s.call_id, s.record, 0, 0, s.state, s.started_at, s.finished_at,
       s.input, s.output, s.target, coalesce(%(now)s::timestamptz, now())
  FROM runs r
  JOIN run_steps s ON s.run_id = %(old_run_id)s
 WHERE r.id = %(run_id)s AND r.state = 'queued' AND r.attempt = 0
   AND s.state IN ('succeeded', 'not_sent_test') AND s.record IS NOT NULL
   AND NOT EXISTS (SELECT 1 FROM run_steps mine WHERE mine.run_id = r.id)
RETURNING n;

-- name: run_steps_ambiguous
-- The steps of a run whose external change may or may not have happened: a mutation left reserved or
-- ambiguous, or settled without its step in the log. A retry from the last step refuses to cross them.
SELECT e.step
  FROM effects e
 WHERE e.run_id = %(run_id)s AND e.mutation
   AND (e.state IN ('reserved', 'ambiguous')
        OR (e.state = 'settled'
            AND NOT EXISTS (SELECT 1 FROM run_steps s
                             WHERE s.run_id = e.run_id AND s.kind = 'tool' AND s.state = 'succeeded'
                               AND s.record IS NOT NULL AND (s.effect_id = e.id OR 'tool:' || s.n = e.step))))
 ORDER BY e.created_at, e.id
 LIMIT 1;
