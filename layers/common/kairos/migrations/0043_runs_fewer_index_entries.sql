-- A claim and a run's end each enter fewer runs indexes (WAL and server CPU a run). Both updates change
-- `state`, which most runs indexes name in their key or predicate, so neither can be HOT: each adds an
-- entry to every index whose predicate the new row version satisfies, the four that cover every row
-- (runs_pkey, runs_occurrence_id_key, runs_owner_created_idx, runs_schedule_created_idx) included. Of
-- the partial ones, three took an entry at every run that no reader needed:
--
-- * runs_running_idx (running runs, keyed by id) is dropped. Its one reader, the rescue's scan for
--   expired leases (runs_lock_expired), reads runs_slot_holders_idx instead: every running run is in
--   it, and besides only the queued runs that hold a slot — never more than an owner's slots. A claim
--   entered both.
-- * runs_owner_active_idx no longer holds running runs. An owner's running runs are among its slot
--   holders (runs_slot_holders_idx), which the status counts now read for them (runs_owner_status,
--   runs_ops_status); the index keeps what the fire's queue cap and those counts read of the others:
--   queued runs and runs awaiting a person.
-- * runs_prunable_idx holds settled runs only: retention prunes nothing else (runs_lock_past_retention
--   asks for settled_at). A run's end no longer enters it; its settlement, which writes settled_at (in
--   runs_unsettled_idx's predicate, so never HOT) and so enters every index anyway, enters it instead.
--
-- A scheduled run's claim now adds 6 index entries (8 before) and its end 5 (6); a webhook run's, one
-- more each (runs_hook_dispatch_idx).
DROP INDEX runs_running_idx;

DROP INDEX runs_owner_active_idx;
CREATE INDEX runs_owner_active_idx ON runs (owner, state)
    WHERE state IN ('queued', 'awaiting_approval', 'awaiting_input') AND owner IS NOT NULL;

DROP INDEX runs_prunable_idx;
CREATE INDEX runs_prunable_idx ON runs (finished_at) WHERE pruned_at IS NULL AND settled_at IS NOT NULL;
