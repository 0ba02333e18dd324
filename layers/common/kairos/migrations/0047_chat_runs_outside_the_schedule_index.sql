-- A chat turn's run no longer enters runs_schedule_created_idx (WAL a chat run).
--
-- A chat turn has no schedule (runs_schedule_iff_not_chat), yet the index covered every run: a NULL
-- key for every chat run, entered by its insert and again by its claim, its end and its settlement
-- (none HOT: each changes a column other runs indexes name). Every reader asks for one schedule's runs
-- (schedule_id = ..., which implies the predicate), so none read those entries.
DROP INDEX runs_schedule_created_idx;
CREATE INDEX runs_schedule_created_idx ON runs (schedule_id, created_at DESC, id DESC) WHERE schedule_id IS NOT NULL;
