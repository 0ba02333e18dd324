-- The trace stored densely: one row per writing statement, not one per event (as Temporal stores a
-- workflow's history, a batch of events per transaction). A run's events were 7 rows with 7 primary
-- key entries and 7 foreign key checks; they are now 3 (the claim's, the effect's, the terminal
-- update's), which is most of what a run writes besides its own row.
--
-- run_event_batches holds, per statement, the events it appended: their common run, time, attempt
-- and fence, and the events in seq order as a JSON array of {type, step, data}; the batch's last seq
-- is its key, its first is last_seq - (number of events) + 1. Writers take the seqs from runs.last_seq,
-- bumped by the number of events in the same statement (unchanged), so a run's batches never overlap
-- and its seqs stay gap-free.
--
-- run_events becomes a view answering what the table did, one row per event with the same columns
-- and types (run_id, seq, type, at, attempt, fence, step, data). On it: INSERT still works (a trigger
-- writes a one-event batch, refusing a seq the run already has, as the primary key did), UPDATE is
-- refused, DELETE is refused unless the retention pruner allowed it (kairos_allow_pruning(): the
-- event is taken out of its batch, the rest kept). On the table: UPDATE, DELETE and TRUNCATE are
-- refused likewise.
--
-- Event types: the batches' check holds the closed list the old IN-list check held, as a JSON array
-- the events' types must be contained in (a containment test costs about as much as the IN-list
-- checks of the rows it replaces; a JSON path filter over the list cost ten times more). A later
-- event type widens the list (drop and re-add the constraint under its name).

CREATE TABLE run_event_batches (
    run_id   uuid NOT NULL REFERENCES runs (id),
    last_seq integer NOT NULL,
    at       timestamptz NOT NULL,
    attempt  integer NOT NULL CHECK (attempt >= 0),
    fence    bigint NOT NULL DEFAULT 0,
    events   jsonb NOT NULL,
    PRIMARY KEY (run_id, last_seq),
    -- A non-empty array whose first seq is at least 1.
    CONSTRAINT run_event_batches_seq_check CHECK (jsonb_typeof(events) = 'array' AND jsonb_array_length(events) >= 1
                                                  AND last_seq >= jsonb_array_length(events)),
    -- Every event has a type of the closed list (an object's "type" member; one per element).
    CONSTRAINT run_event_batches_type_check CHECK (
        jsonb_array_length(jsonb_path_query_array(events, '$[*].type')) = jsonb_array_length(events)
        AND jsonb_path_query_array(events, '$[*].type') <@ '[
        "run.queued", "run.claimed", "step.started", "step.progress", "step.finished", "effect.reserved",
        "effect.settled", "output.published", "run.rescued", "run.cancel_requested", "run.deferred",
        "approval.waiting", "approval.approved", "approval.denied", "input.waiting", "input.answered",
        "corpus.phase", "corpus.partition", "run.paused", "run.resumed", "run.succeeded", "run.failed",
        "run.cancelled", "run.expired", "run.abandoned", "run.policy_blocked"]'::jsonb)
);

-- The existing events, each statement's again one batch: consecutive events of a run with the same
-- time, attempt and fence (one statement's share all three).
INSERT INTO run_event_batches (run_id, last_seq, at, attempt, fence, events)
SELECT run_id, max(seq), at, attempt, fence,
       jsonb_agg(jsonb_build_object('type', type, 'step', step, 'data', data) ORDER BY seq)
  FROM (SELECT e.*, e.seq - row_number() OVER (PARTITION BY run_id, at, attempt, fence ORDER BY seq) AS island
          FROM run_events e) AS numbered
 GROUP BY run_id, at, attempt, fence, island;

DROP TABLE run_events;

CREATE VIEW run_events AS
SELECT b.run_id,
       (b.last_seq - jsonb_array_length(b.events) + x.ord)::integer AS seq,
       x.event ->> 'type' AS type,
       b.at,
       b.attempt,
       b.fence,
       x.event ->> 'step' AS step,
       coalesce(x.event -> 'data', '{}'::jsonb) AS data
  FROM run_event_batches b
 CROSS JOIN LATERAL jsonb_array_elements(b.events) WITH ORDINALITY AS x (event, ord);

COMMENT ON VIEW run_events IS
    'Each run''s append-only, gap-free trace, one row per event (stored as run_event_batches).';

ALTER VIEW run_events ALTER COLUMN at SET DEFAULT now();
ALTER VIEW run_events ALTER COLUMN fence SET DEFAULT 0;
ALTER VIEW run_events ALTER COLUMN data SET DEFAULT '{}'::jsonb;

-- INSERT INTO run_events: one event, its own batch (the writers of the run path write batches).
CREATE FUNCTION kairos_run_events_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.data IS NULL THEN
        RAISE EXCEPTION 'null value in column "data" of relation "run_events" violates not-null constraint'
            USING ERRCODE = 'not_null_violation';
    END IF;
    IF EXISTS (SELECT 1 FROM run_event_batches b
                WHERE b.run_id = NEW.run_id AND b.last_seq >= NEW.seq
                  AND b.last_seq - jsonb_array_length(b.events) < NEW.seq) THEN
        RAISE EXCEPTION 'duplicate key value violates unique constraint "run_events_pkey"'
            USING ERRCODE = 'unique_violation',
                  DETAIL = format('Key (run_id, seq)=(%s, %s) already exists.', NEW.run_id, NEW.seq);
    END IF;
    INSERT INTO run_event_batches (run_id, last_seq, at, attempt, fence, events)
    VALUES (NEW.run_id, NEW.seq, NEW.at, NEW.attempt, NEW.fence,
            jsonb_build_array(jsonb_build_object('type', NEW.type, 'step', NEW.step, 'data', NEW.data)));
    RETURN NEW;
END;
$$;

-- DELETE FROM run_events under kairos_allow_pruning(): the event leaves its batch; the events before
-- and after it stay, each side its own batch (their seqs unchanged).
CREATE FUNCTION kairos_run_events_prune() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    b run_event_batches;
BEGIN
    DELETE FROM run_event_batches
     WHERE run_id = OLD.run_id AND last_seq >= OLD.seq AND last_seq - jsonb_array_length(events) < OLD.seq
    RETURNING * INTO b;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    INSERT INTO run_event_batches (run_id, last_seq, at, attempt, fence, events)
    SELECT b.run_id, max(p.seq), b.at, b.attempt, b.fence, jsonb_agg(p.event ORDER BY p.seq)
      FROM (SELECT (b.last_seq - jsonb_array_length(b.events) + x.ord)::integer AS seq, x.event
              FROM jsonb_array_elements(b.events) WITH ORDINALITY AS x (event, ord)) AS p
     WHERE p.seq <> OLD.seq
     GROUP BY p.seq > OLD.seq;
    RETURN OLD;
END;
$$;

CREATE TRIGGER run_events_insert INSTEAD OF INSERT ON run_events
    FOR EACH ROW EXECUTE FUNCTION kairos_run_events_insert();
CREATE TRIGGER run_events_immutable INSTEAD OF UPDATE ON run_events
    FOR EACH ROW EXECUTE FUNCTION kairos_refuse_update();
-- Statement level: refused even when no row matches, as on the table.
CREATE TRIGGER run_events_no_delete BEFORE DELETE ON run_events
    FOR EACH STATEMENT EXECUTE FUNCTION kairos_refuse_delete();
CREATE TRIGGER run_events_prune INSTEAD OF DELETE ON run_events
    FOR EACH ROW EXECUTE FUNCTION kairos_run_events_prune();

CREATE TRIGGER run_event_batches_immutable BEFORE UPDATE ON run_event_batches
    FOR EACH ROW EXECUTE FUNCTION kairos_refuse_update();
CREATE TRIGGER run_event_batches_no_delete BEFORE DELETE ON run_event_batches
    FOR EACH STATEMENT EXECUTE FUNCTION kairos_refuse_delete();
CREATE TRIGGER run_event_batches_no_truncate BEFORE TRUNCATE ON run_event_batches
    FOR EACH STATEMENT EXECUTE FUNCTION kairos_refuse_delete();
