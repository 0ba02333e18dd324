-- Plans that stay right when the statistics of runs are stale (issue 14). Autovacuum analyzes runs
-- when a tenth of it has changed, so the statistics a burst is planned from were usually taken at a
-- quiet moment, when no run was queued: the planner then takes every partial index of active runs
-- to be empty, and for "this owner's queued runs" (the queue cap's count, once per owner of every
-- fire batch) it chose among them by a hair of cost. It chose runs_schedule_active_idx (every
-- schedule's active runs, owner checked against the heap row), so each owner's count read every
-- queued run there was, and the batches of a burst grew quadratically: a fresh deployment's first
-- 10,000 fires took 32 s instead of 2.4 s (docs/benchmarks.md, "Fifth pass").
--
-- Each index of active runs now carries, in its predicate, what its own queries already say and
-- the owner's counts do not, so that for those counts only runs_owner_active_idx, whose key is
-- (owner, state), remains:
-- * runs_schedule_active_idx: schedule_id IS NOT NULL. It is read by schedule (overlap, the tick's
--   active run), and a chat turn's run, which has no schedule, has no place in it.
-- * runs_handoff_idx: blocked_by_run_id IS NULL. It is read by the handoff repair, which sends only
--   unblocked runs; a queued-behind run is found through runs_blocked_idx.
-- runs_owner_active_idx also takes the two waiting states, so that an owner's status (its queued,
-- running and waiting runs: GET /v1/status) reads that owner's active runs only.
-- None of these columns is written by a heartbeat: those updates stay HOT (0002).
DROP INDEX runs_schedule_active_idx;
CREATE INDEX runs_schedule_active_idx ON runs (schedule_id)
    WHERE state IN ('queued', 'running', 'awaiting_approval', 'awaiting_input') AND schedule_id IS NOT NULL;
DROP INDEX runs_handoff_idx;
CREATE INDEX runs_handoff_idx ON runs (handoff_at NULLS FIRST, created_at)
    WHERE state = 'queued' AND blocked_by_run_id IS NULL;
DROP INDEX runs_owner_active_idx;
CREATE INDEX runs_owner_active_idx ON runs (owner, state)
    WHERE state IN ('queued', 'running', 'awaiting_approval', 'awaiting_input');
