-- name: schedules_placeholder
-- Placeholder so the loader has one file; replaced by the schedule queries.
SELECT 1;
