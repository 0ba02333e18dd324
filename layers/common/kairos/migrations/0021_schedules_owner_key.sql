-- An owner's schedule found by its id keeps to one row for an owner the statistics never saw (issue
-- 14, eighth pass). Every statement on one schedule of one owner (GET, PATCH, pause, resume, cancel,
-- trigger, token rotation, a loop's edits) says `id = ... AND owner = ...`. For an owner that has no
-- row in the statistics (a new tenant's first schedules, created between two ANALYZEs), the planner
-- took `owner = ...` to be as selective as the primary key and read the owner's schedules through
-- schedules_owner_idx (owner, created_at), fetching every one of them to find one: 400 of 400 in
-- tests/db/test_stale_statistics.py, on PostgreSQL 15 and 18.
--
-- With id the index's last column, `id = ...` is checked in the index itself, so one row is fetched
-- whichever index the planner takes (PostgreSQL 18 skips straight to it; 15 reads the owner's index
-- entries, a few to the page). The index also gives schedules_list its whole order (created_at, id).
-- Rebuilt in the migration's transaction: deploy it at a quiet moment, like 0017, 0019 and 0020.
DROP INDEX schedules_owner_idx;
CREATE INDEX schedules_owner_idx ON schedules (owner, created_at, id);
