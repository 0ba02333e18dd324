-- The tick's due-schedule scan under dead tuples (issue 14). A fire batch claims due schedules in
-- (next_fire_at, id) order and the tick resumes each batch after the last key it claimed (a keyset
-- cursor, schedules_lock_due's after_at / after_id), so a batch starts where the previous one ended
-- instead of walking, from the oldest due key, the index entries of every schedule already fired in
-- this tick — entries whose dead row versions a long-running snapshot keeps from being pruned. The
-- index carries id for that row comparison and replaces the narrower (next_fire_at) one.
CREATE INDEX schedules_due_key_idx ON schedules (next_fire_at, id) WHERE status = 'active';
DROP INDEX schedules_due_idx;
