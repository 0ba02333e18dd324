-- A claim enters one runs index fewer: runs_schedule_active_idx no longer holds running runs (as
-- runs_owner_active_idx since 0043). A claim changes `state`, so it is never HOT and adds an entry to
-- every index its new row version is in; a schedule's running runs are among its owner's slot holders
-- (runs_slot_holders_idx: never more than the owner's slots), where the overlap reads (the tick's
-- schedules_lock_due, runs_overlap_of_schedule) now find them. The index keeps the schedule's queued
-- runs and its runs awaiting a person, which the same reads, the queued-behind probe and a webhook's
-- window fold look for.
DROP INDEX runs_schedule_active_idx;
CREATE INDEX runs_schedule_active_idx ON runs (schedule_id)
    WHERE state IN ('queued', 'awaiting_approval', 'awaiting_input') AND schedule_id IS NOT NULL;
