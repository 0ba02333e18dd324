-- Test runs (POST /v1/schedules/{id}/test, kairos.schedules.manual.test): a run of the schedule's
-- current revision with real model calls whose mutation tool calls are recorded, never sent. Its
-- occurrence and run carry source `test`, and the run `test` (true exactly for that source), so every
-- reader that must leave test runs out (the settle step's failure count and notify, last_run, overlap)
-- can say so without knowing the list of sources.
SELECT kairos_widen_check('occurrences', 'source', ARRAY['test']);
SELECT kairos_widen_check('runs', 'source', ARRAY['test']);

ALTER TABLE occurrences DROP CONSTRAINT occurrences_keyed;
ALTER TABLE occurrences ADD CONSTRAINT occurrences_keyed
    CHECK (source NOT IN ('webhook', 'manual', 'test') OR idempotency_key IS NOT NULL);

ALTER TABLE runs ADD COLUMN test boolean NOT NULL DEFAULT false;
ALTER TABLE runs ADD CONSTRAINT runs_test_iff_source CHECK (test = (source = 'test'));

-- A mutation a test run's tool loop did not send: recorded with its would-be arguments in the step
-- log, its effect final at once (never reserved, never counted as a call or a kept change).
SELECT kairos_widen_check('effects', 'state', ARRAY['not_sent_test']);
