-- Fires while paused (kairos.schedules.paused): a pause records when it began and why, so resume can
-- record the fires that fell in it as one `skipped_paused` occurrence (covers_from/covers_until/
-- covers_count), and the schedule shows the reason while it is paused.
ALTER TABLE schedules ADD COLUMN paused_at timestamptz;
ALTER TABLE schedules ADD COLUMN paused_reason text;
ALTER TABLE schedules ADD CONSTRAINT schedules_paused_reason_bounded
    CHECK (paused_reason IS NULL OR char_length(paused_reason) <= 500);
-- A schedule paused before this migration: its pause began at its last change at the latest.
UPDATE schedules SET paused_at = updated_at WHERE status = 'paused';

SELECT kairos_widen_check('occurrences', 'decision', ARRAY['skipped_paused']);

-- The definition a revision records leaves out the pause (state, like the status and the cursor).
CREATE OR REPLACE FUNCTION kairos_schedule_definition(s schedules) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT to_jsonb(s) - ARRAY['id', 'owner', 'conversation_id', 'status', 'revision', 'next_fire_at',
                               'next_dispatch_at', 'last_fire_at', 'fire_count', 'consecutive_failures',
                               'token_hash', 'previous_token_hash', 'previous_token_expires_at',
                               'created_by_run_id', 'created_at', 'updated_at', 'input_run_id',
                               'paused_at', 'paused_reason']
$$;
