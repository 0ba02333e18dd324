-- Steps a person can read: the step log (0012) becomes the record of every model turn and tool call of
-- a run, not only the completed ones a later attempt folds. Each row now carries its state, when it
-- started and finished, bounded and redacted previews of its input and output, where an outbound call
-- went (method, host, path), what it used, and the effect it settled. The worker moves a step's state
-- with guarded updates under the run's fence (running -> succeeded | failed | ambiguous;
-- waiting_approval -> running | denied | failed), so the row is no longer update-proof; the retention
-- pruner clears the previews and the fold record and stamps pruned_at instead of deleting the row.
-- Rows written before this migration were completed steps: succeeded, started and finished when written.
DROP TRIGGER run_steps_no_update ON run_steps;

ALTER TABLE run_steps
    ALTER COLUMN record DROP NOT NULL,
    ADD COLUMN state text NOT NULL DEFAULT 'succeeded'
        CONSTRAINT run_steps_state_check CHECK (state IN (
            'running', 'succeeded', 'failed', 'ambiguous', 'waiting_approval', 'denied', 'not_sent_test')),
    ADD COLUMN started_at timestamptz,
    ADD COLUMN finished_at timestamptz,
    ADD COLUMN input jsonb,
    ADD COLUMN output jsonb,
    ADD COLUMN target jsonb,
    ADD COLUMN usage jsonb,
    ADD COLUMN effect_id uuid,
    ADD COLUMN pruned_at timestamptz;

UPDATE run_steps SET started_at = created_at, finished_at = created_at;

ALTER TABLE run_steps
    ALTER COLUMN started_at SET NOT NULL,
    ALTER COLUMN started_at SET DEFAULT now(),
    -- finished_at is set exactly when the step has ended
    ADD CONSTRAINT run_steps_finished_when_ended
        CHECK ((finished_at IS NULL) = (state IN ('running', 'waiting_approval'))),
    -- a completed step keeps what a later attempt folds, until retention forgets it
    ADD CONSTRAINT run_steps_succeeded_has_record
        CHECK (state <> 'succeeded' OR record IS NOT NULL OR pruned_at IS NOT NULL);
