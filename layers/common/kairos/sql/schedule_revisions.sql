-- schedule_revisions: every revision of a schedule's definition, written by a trigger on schedules
-- (migration 0007); read by a backfill to evaluate each instant with the revision then in force.

-- name: schedule_revisions_list
-- Every revision of a schedule, oldest first, with the instant each took effect.
SELECT revision, definition, valid_from
  FROM schedule_revisions
 WHERE schedule_id = %(schedule_id)s
 ORDER BY revision;
