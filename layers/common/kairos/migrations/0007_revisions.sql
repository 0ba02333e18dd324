-- Steering runs: every revision of a schedule's definition is kept, runs
-- execute the revision their occurrence recorded, retries point at the run they retry, and a fourth
-- overlap policy replaces a run still waiting or running.

-- schedule_revisions: one row per value `schedules.revision` ever takes, written by a trigger on
-- schedules, so no writer (create, edit, pause, resume, cancel, the tick completing or pausing a
-- schedule) can bump the revision without recording it. `definition` is the row without its
-- identity, status, cursor, counters, webhook token material and timestamps: what a revision says
-- (prompt, rule, zone, policies, agent snapshot, and columns later migrations add to the definition).
-- `valid_from` is the time the revision took effect (the writing statement's injectable clock).
CREATE TABLE schedule_revisions (
    schedule_id uuid NOT NULL REFERENCES schedules (id),
    revision    integer NOT NULL CHECK (revision >= 1),
    definition  jsonb NOT NULL,
    valid_from  timestamptz NOT NULL,
    PRIMARY KEY (schedule_id, revision)
);

CREATE FUNCTION kairos_schedule_definition(s schedules) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT to_jsonb(s) - ARRAY['id', 'owner', 'conversation_id', 'status', 'revision', 'next_fire_at',
                               'last_fire_at', 'fire_count', 'consecutive_failures', 'token_hash',
                               'previous_token_hash', 'previous_token_expires_at', 'created_by_run_id',
                               'created_at', 'updated_at']
$$;

CREATE FUNCTION kairos_record_revision() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO schedule_revisions (schedule_id, revision, definition, valid_from)
    VALUES (NEW.id, NEW.revision, kairos_schedule_definition(NEW),
            CASE WHEN TG_OP = 'INSERT' THEN NEW.created_at ELSE NEW.updated_at END)
    ON CONFLICT (schedule_id, revision) DO NOTHING;
    RETURN NULL;
END;
$$;

CREATE TRIGGER schedules_record_revision_insert AFTER INSERT ON schedules
    FOR EACH ROW EXECUTE FUNCTION kairos_record_revision();
CREATE TRIGGER schedules_record_revision_update AFTER UPDATE OF revision ON schedules
    FOR EACH ROW WHEN (NEW.revision <> OLD.revision) EXECUTE FUNCTION kairos_record_revision();

-- Revisions are history: rewriting one would change what a past run is said to have executed.
CREATE FUNCTION kairos_refuse_revision_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'schedule_revisions rows are immutable: % is refused', TG_OP
        USING ERRCODE = 'restrict_violation';
END;
$$;
CREATE TRIGGER schedule_revisions_immutable BEFORE UPDATE ON schedule_revisions
    FOR EACH STATEMENT EXECUTE FUNCTION kairos_refuse_revision_change();

-- Existing schedules: their current definition as their current revision, valid since it was written.
INSERT INTO schedule_revisions (schedule_id, revision, definition, valid_from)
SELECT s.id, s.revision, kairos_schedule_definition(s), s.updated_at FROM schedules s;

-- runs.retry_of: the run a `POST /v1/runs/{id}/retry` made this one from (the old run stays as it ended).
ALTER TABLE runs ADD COLUMN retry_of uuid REFERENCES runs (id);
CREATE UNIQUE INDEX runs_retry_of_idx ON runs (retry_of) WHERE retry_of IS NOT NULL;

-- cancel_replace: a fire that finds the previous run queued or running cancels it and dispatches.
ALTER TABLE schedules DROP CONSTRAINT schedules_overlap_check;
ALTER TABLE schedules ADD CONSTRAINT schedules_overlap_check
    CHECK (overlap IN ('allow', 'skip', 'queue_one', 'cancel_replace'));

-- Backfill runs of one schedule run one at a time, oldest first: each waits for the one before.
CREATE INDEX runs_schedule_backfill_idx ON runs (schedule_id, created_at DESC) WHERE source = 'backfill';
