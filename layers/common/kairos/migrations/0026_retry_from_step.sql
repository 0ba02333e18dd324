-- Retry from the last step (POST /v1/runs/{id}/retry {"from": "last_step"}, kairos.schedules.manual):
-- the new run's step log starts as a copy of the old run's completed steps, which its tool loop folds
-- instead of calling again; `resumed_from` is the number of the last step it took over (NULL for any other
-- run).
ALTER TABLE runs ADD COLUMN resumed_from integer;
ALTER TABLE runs ADD CONSTRAINT runs_resumed_from_is_retry
    CHECK (resumed_from IS NULL OR (resumed_from >= 0 AND retry_of IS NOT NULL));
