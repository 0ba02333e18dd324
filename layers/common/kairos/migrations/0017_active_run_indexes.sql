-- Plans that stay right when the statistics of runs are stale (issue 14). Autovacuum analyzes runs
-- when a tenth of it has changed, so a burst is usually planned from statistics taken at a quiet
-- moment, when no run was queued or running: the planner then takes every partial index of active
-- runs to be empty, and a scan of a whole "empty" index costs less, to it, than one probe of the
-- primary key. So, before this migration:
-- * every claim (runs_claim: this id, queued, unblocked) read every queued run, through
--   runs_owner_active_idx or runs_handoff_idx, instead of its row by runs_pkey;
-- * every owner's queue count (once per owner of every fire batch) and slot count (once per claim)
--   read every active run, through runs_schedule_active_idx, owner checked against the heap row;
-- * every fenced statement of a running run (this id, this fence, running) could read every running
--   run through runs_running_idx.
-- A burst's work grew with the square of its size: a fresh deployment's first 10,000 fires took 32 s
-- instead of 1.5 s (docs/benchmarks.md, "Fifth pass"; tests/db/test_stale_statistics.py).
--
-- Each partial index of active runs now carries, in its predicate, a conjunct that its own queries
-- state and the statements by id do not, so that the planner cannot use it for them (a partial index
-- serves only a query whose conditions imply its predicate). Each conjunct holds for every row the
-- index covers, so no index changes what it holds, and none names a column a heartbeat writes (those
-- updates stay HOT, 0002):
-- * runs_owner_active_idx: owner IS NOT NULL, which an "owner = ..." implies (owner is NOT NULL anyway).
--   It also takes the two waiting states, so that an owner's status (GET /v1/status) reads that
--   owner's active runs only.
-- * runs_schedule_active_idx: schedule_id IS NOT NULL, which a "schedule_id = ..." implies; a chat
--   turn's run has no schedule and had no business in it.
-- * runs_handoff_idx: an unblocked run (the repair sends only those) with unclaimed_handoffs >= 0,
--   which the repair states (a CHECK holds it for every row).
-- * runs_running_idx: lease_token IS NOT NULL, which the expired-lease scan states (runs_lease_iff_running
--   holds it for every running run).
DROP INDEX runs_owner_active_idx;
CREATE INDEX runs_owner_active_idx ON runs (owner, state)
    WHERE state IN ('queued', 'running', 'awaiting_approval', 'awaiting_input') AND owner IS NOT NULL;
DROP INDEX runs_schedule_active_idx;
CREATE INDEX runs_schedule_active_idx ON runs (schedule_id)
    WHERE state IN ('queued', 'running', 'awaiting_approval', 'awaiting_input') AND schedule_id IS NOT NULL;
DROP INDEX runs_handoff_idx;
CREATE INDEX runs_handoff_idx ON runs (handoff_at NULLS FIRST, created_at)
    WHERE state = 'queued' AND blocked_by_run_id IS NULL AND unclaimed_handoffs >= 0;
DROP INDEX runs_running_idx;
CREATE INDEX runs_running_idx ON runs (id) WHERE state = 'running' AND lease_token IS NOT NULL;
