-- Webhook flow control (kairos.flow; docs/api.md "Webhook flow"): a webhook schedule's `flow`
-- (debounce, batch, concurrency key, what a delivery over the rate gets), the runs that collect
-- deliveries in a window or wait for the rate, and the deliveries folded into them.

-- The checked flow settings (kairos.schedules.flow_spec): NULL = none, every delivery its own run.
ALTER TABLE schedules ADD COLUMN flow jsonb;

-- held_until: a queued run is neither claimed nor handed to SQS before this instant (a debounce or
-- batch window still open, or a delivery deferred until the hook's rate allows it). It stays set
-- afterwards: the instant the run became dispatchable, which the hook's rate counts.
-- flow_window / window_deadline / deliveries: a run collecting webhook deliveries (debounce: the
-- last payload; batch: the array of them), the instant its window closes at the latest, and how many
-- deliveries it carries.
ALTER TABLE runs
    ADD COLUMN held_until timestamptz,
    ADD COLUMN flow_window text CHECK (flow_window IN ('debounce', 'batch')),
    ADD COLUMN window_deadline timestamptz,
    ADD COLUMN deliveries integer CHECK (deliveries >= 1),
    ADD CONSTRAINT runs_window_shape CHECK ((flow_window IS NULL) = (deliveries IS NULL)
                                           AND (flow_window IS NULL OR held_until IS NOT NULL));

-- coalesced: a delivery folded into another run's window; coalesced_into names that run.
SELECT kairos_widen_check('occurrences', 'decision', ARRAY['coalesced']);
ALTER TABLE occurrences
    ADD COLUMN coalesced_into uuid,
    ADD CONSTRAINT occurrences_coalesced_shape CHECK ((decision = 'coalesced') = (coalesced_into IS NOT NULL));

-- A hook's rate counts its runs by the instant each became dispatchable (kairos.flow.rate).
CREATE INDEX runs_hook_dispatch_idx ON runs (schedule_id, (coalesce(held_until, created_at)))
    WHERE source = 'webhook';
