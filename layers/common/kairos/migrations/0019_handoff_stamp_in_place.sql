-- The handoff stamp updates a run in place (issue 14, sixth pass). After each batch's commit the tick
-- stamps every run SQS accepted (runs_stamp_handoff: handoff_at, handoff_count, unclaimed_handoffs).
-- runs_handoff_idx had handoff_at in its key and unclaimed_handoffs in its predicate, so no stamp
-- could be a HOT update: each wrote a new row version elsewhere and an entry in all seven indexes
-- a queued run is in, as many as the run's insert. Those were a third of the index entries a fire
-- wrote, and the stamp about a sixth of the tick's statement time (docs/benchmarks.md, "Sixth pass").
--
-- * runs_handoff_idx now names no column the stamp writes. It holds the same rows (queued,
--   unblocked), keyed by created_at, with a conjunct the repair states and statements by id do not
--   (max_attempts >= 1, true of every row by runs_max_attempts_check; see 0017 for why). The repair
--   (runs_lock_unsent) reads the queued, unblocked runs from it and checks handoff_at on each row;
--   their number is bounded by the owners' queue caps (KAIROS_OWNER_QUEUE_MAX), and it runs once a
--   tick, while a stamp happens once per fire.
-- * fillfactor 50: a HOT update needs room for the new version on the row's own page, and a batch
--   stamps every run it inserted, on the pages it just filled. At 80 only a quarter of a page's runs
--   found room; at 50 all of them do, as do the heartbeats and the event-counter updates of a running
--   run (0002). It applies to pages written from now on; the table takes more pages for the same runs.
DROP INDEX runs_handoff_idx;
CREATE INDEX runs_handoff_idx ON runs (created_at)
    WHERE state = 'queued' AND blocked_by_run_id IS NULL AND max_attempts >= 1;
ALTER TABLE runs SET (fillfactor = 50);
