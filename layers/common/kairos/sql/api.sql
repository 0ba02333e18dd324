-- Queries of the HTTP API itself (everything else it reads goes through the owning modules).

-- name: schedules_preview_clock
-- The database time a schedule preview starts from when the caller gives no `after`.
SELECT coalesce(%(now)s::timestamptz, now()) AS now;
