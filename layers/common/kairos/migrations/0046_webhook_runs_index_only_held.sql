-- A webhook run's claim and end no longer add an entry to runs_hook_dispatch_idx (WAL a run).
--
-- The index covered every webhook run, keyed by the instant it became dispatchable
-- (coalesce(held_until, created_at)). A claim and a run's end change `state`, which other runs indexes
-- name, so neither update is HOT: each new row version took one more entry here, though neither
-- changes the key. Its one reader, a hook's rate (runs_hook_rate_window), now reads a run's instant
-- from the index that already holds it: held runs (held_until set, their instant) from this index,
-- narrowed to them; the others (their instant is created_at) from runs_schedule_created_idx, which
-- every run enters anyway. Most webhook runs are never held, so their claim and end each add one
-- entry fewer (5 instead of 6).
DROP INDEX runs_hook_dispatch_idx;
CREATE INDEX runs_hook_dispatch_idx ON runs (schedule_id, held_until)
    WHERE source = 'webhook' AND held_until IS NOT NULL;
