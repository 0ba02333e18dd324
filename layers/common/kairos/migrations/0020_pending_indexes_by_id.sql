-- Statements by id keep to their primary key under stale statistics (issue 14, seventh pass): 0017's
-- device for the partial indexes of pending rows, which carried the same fault. Autovacuum analyzes a
-- table after a tenth of it changed, so a burst of notify deliveries (one per ended run of a schedule
-- with `notify`), approvals or input requests is usually planned from statistics taken when none was
-- pending. The planner then takes a pending-rows index to be empty, and a scan of the whole "empty"
-- index costs less, to it, than one probe of the primary key: every statement that finds its row by id
-- and also says `state = 'pending'` (a delivery delivered, retried or given up; an approval decided; an
-- input request answered) read every pending row. 10,000 pending deliveries under statistics that saw
-- none: 3 ms and 10,000 rows read to mark one delivered, so a burst's deliveries cost its size squared
-- (tests/db/test_stale_statistics.py).
--
-- Each index below gets a conjunct that its own queries imply and the statements by id do not mention
-- (a partial index serves only a query whose conditions imply its predicate). Each conjunct holds for
-- every row the index held, so none changes what it holds (but the last, below):
-- * notify_deliveries_due_idx: next_attempt_at IS NOT NULL, implied by the claim's
--   "next_attempt_at <= now" (a strict comparison is never true of a NULL).
-- * approvals_pending_expiry_idx: decided_at IS NULL (every pending approval's, approvals_decided),
--   which only the expiry states: a decision says "expires_at > now", which would imply a conjunct
--   on expires_at, and PostgreSQL 17 drops a stated "IS NOT NULL" of a NOT NULL column before it
--   matches an index predicate.
-- * input_requests_schedule_pending_idx: schedule_id IS NOT NULL, implied by "schedule_id = ...".
-- * input_requests_one_pending_idx (one pending request a run): run_id IS NOT NULL, implied by
--   "run_id = ..."; no ON CONFLICT names it as its arbiter.
-- * schedules_due_key_idx (active schedules by cursor, 0016): next_fire_at IS NOT NULL, implied by the
--   due scans' "next_fire_at <= now" and the cursor move's "next_fire_at = ...". Pausing a schedule (the
--   API, the tick) and finding a webhook's schedule by its token hash say "status = 'active'" and scanned
--   every active schedule under statistics taken before any was (a first deploy). next_fire_at is NULL
--   only for schedules that never fire (webhooks), which no due scan wants: the index holds fewer rows.
DROP INDEX notify_deliveries_due_idx;
CREATE INDEX notify_deliveries_due_idx ON notify_deliveries (next_attempt_at)
    WHERE state = 'pending' AND next_attempt_at IS NOT NULL;
DROP INDEX approvals_pending_expiry_idx;
CREATE INDEX approvals_pending_expiry_idx ON approvals (expires_at)
    WHERE state = 'pending' AND decided_at IS NULL;
DROP INDEX input_requests_schedule_pending_idx;
CREATE INDEX input_requests_schedule_pending_idx ON input_requests (schedule_id)
    WHERE state = 'pending' AND schedule_id IS NOT NULL;
DROP INDEX input_requests_one_pending_idx;
CREATE UNIQUE INDEX input_requests_one_pending_idx ON input_requests (run_id)
    WHERE state = 'pending' AND run_id IS NOT NULL;
DROP INDEX schedules_due_key_idx;
CREATE INDEX schedules_due_key_idx ON schedules (next_fire_at, id) WHERE status = 'active' AND next_fire_at IS NOT NULL;
