-- Runs that must not run (kairos.execution.claim): the claim refuses a run past its expiry, and the
-- tick fails a run SQS never delivered.
--
-- schedules.max_delay_seconds: how late a scheduled run without catch-up may still start, counted
-- from its fire instant (default 600 s, 60 s to one day). A 07:00 briefing is never delivered at 11:00.
ALTER TABLE schedules ADD COLUMN max_delay_seconds integer NOT NULL DEFAULT 600
    CONSTRAINT schedules_max_delay_bounds CHECK (max_delay_seconds BETWEEN 60 AND 86400);

-- runs.expires_at: a run not claimed by then ends `expired` at its claim; NULL when it may wait
-- (catch-up on, webhook and manual runs, a queued-behind run until it is released).
ALTER TABLE runs ADD COLUMN expires_at timestamptz;

-- runs.unclaimed_handoffs: messages SQS accepted for this run since its last claim (stamped with
-- the handoff, reset by the claim). At five the tick's repair ends the run `failed`
-- (`undeliverable`) instead of sending it again. handoff_count keeps counting every send.
ALTER TABLE runs ADD COLUMN unclaimed_handoffs integer NOT NULL DEFAULT 0
    CONSTRAINT runs_unclaimed_handoffs_nonneg CHECK (unclaimed_handoffs >= 0);
