-- schedule_revisions: every revision of a schedule's definition, written by a trigger on schedules
-- (migration 0007); read by a backfill to evaluate each instant with the revision then in force.

-- name: schedule_revisions_list
-- Every revision of a schedule, oldest first, with the instant each took effect.
SELECT revision, definition, valid_from
  FROM schedule_revisions
 WHERE schedule_id = %(schedule_id)s
 ORDER BY revision;

-- name: schedule_revisions_goal_of_run
-- The goal a loop run works toward: the one its occurrence's revision recorded (kairos.execution.goal_report).
SELECT o.schedule_id, o.schedule_revision AS revision, d.definition -> 'goal' AS goal
  FROM runs r
  JOIN occurrences o ON o.id = r.occurrence_id
  JOIN schedule_revisions d ON d.schedule_id = o.schedule_id AND d.revision = o.schedule_revision
 WHERE r.id = %(run_id)s;
