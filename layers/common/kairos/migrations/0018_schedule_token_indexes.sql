-- The webhook token indexes hold webhook schedules only (issue 14). token_hash and previous_token_hash
-- were UNIQUE columns, and a unique index holds a NULL key for every row: every cron, interval and
-- once schedule, whose token columns are NULL. The tick moves each fired schedule's cursor, a new row
-- version (next_fire_at is indexed), and each version took an entry in both of them, two of the six
-- index entries a fire wrote to schedules. Partial unique indexes keep the same rule (two non-NULL
-- tokens never collide; NULLs never did) and the webhook lookup (token_hash = the presented hash)
-- still finds them: an equality implies IS NOT NULL.
ALTER TABLE schedules DROP CONSTRAINT schedules_token_hash_key;
ALTER TABLE schedules DROP CONSTRAINT schedules_previous_token_hash_key;
CREATE UNIQUE INDEX schedules_token_hash_key ON schedules (token_hash) WHERE token_hash IS NOT NULL;
CREATE UNIQUE INDEX schedules_previous_token_hash_key ON schedules (previous_token_hash)
    WHERE previous_token_hash IS NOT NULL;
