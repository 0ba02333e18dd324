-- The run path's server share (issue 41): the foreign-key checks an echo run paid for, and a usage
-- function re-planned at every call.
--
-- * Eight foreign-key checks a run: each of the claim's thread, prompt entry and trace batch, the
--   effect and its batch, the answer entry and the terminal batch ran a referential-integrity query
--   against its parent row and key-share-locked it (a tuple lock written to the WAL). Every one of
--   those inserts selects its parent in the same statement (the run row it updates under its fence,
--   the conversation it reads), so the check can only fail if the parent is deleted, and no code
--   deletes a run or a conversation. So runs and conversations now refuse DELETE and TRUNCATE
--   (statement triggers: nothing on the hot path), and the five keys that only re-checked what the
--   inserting statement had just read are dropped: run_event_batches.run_id, effects.run_id,
--   runs.conversation_id, conversations.parent_id and conversation_entries.conversation_id. The
--   run_events view's INSERT (one event, not the run path's writers) still refuses an unknown run.
-- * kairos_run_usage and kairos_run_usage_with were SQL functions that cannot be inlined (an
--   aggregate), so every call parsed and planned their query again (~0.4 ms of a run's publish);
--   as PL/pgSQL the plan is cached on the connection. Same query, same answer.
-- * effects_run_idx (run_id) duplicated the leading column of effects_run_id_fence_step_key (run_id,
--   fence, step), which answers every lookup by run: one index entry fewer per effect.

CREATE FUNCTION kairos_refuse_parent_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% rows are never deleted: the trace, effects and entries that name them have no foreign key',
        TG_TABLE_NAME
        USING ERRCODE = 'restrict_violation';
END;
$$;

CREATE TRIGGER runs_no_delete BEFORE DELETE ON runs
    FOR EACH STATEMENT EXECUTE FUNCTION kairos_refuse_parent_delete();
CREATE TRIGGER runs_no_truncate BEFORE TRUNCATE ON runs
    FOR EACH STATEMENT EXECUTE FUNCTION kairos_refuse_parent_delete();
CREATE TRIGGER conversations_no_delete BEFORE DELETE ON conversations
    FOR EACH STATEMENT EXECUTE FUNCTION kairos_refuse_parent_delete();
CREATE TRIGGER conversations_no_truncate BEFORE TRUNCATE ON conversations
    FOR EACH STATEMENT EXECUTE FUNCTION kairos_refuse_parent_delete();

ALTER TABLE run_event_batches DROP CONSTRAINT run_event_batches_run_id_fkey;
ALTER TABLE effects DROP CONSTRAINT effects_run_id_fkey;
ALTER TABLE runs DROP CONSTRAINT runs_conversation_id_fkey;
ALTER TABLE conversations DROP CONSTRAINT conversations_parent_id_fkey;
ALTER TABLE conversation_entries DROP CONSTRAINT conversation_entries_conversation_id_fkey;

DROP INDEX effects_run_idx;

-- INSERT INTO run_events (0034), with the check the dropped key made.
CREATE OR REPLACE FUNCTION kairos_run_events_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.data IS NULL THEN
        RAISE EXCEPTION 'null value in column "data" of relation "run_events" violates not-null constraint'
            USING ERRCODE = 'not_null_violation';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM runs r WHERE r.id = NEW.run_id) THEN
        RAISE EXCEPTION 'insert or update on table "run_events" violates foreign key constraint "run_events_run_id_fkey"'
            USING ERRCODE = 'foreign_key_violation',
                  DETAIL = format('Key (run_id)=(%s) is not present in table "runs".', NEW.run_id);
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

CREATE OR REPLACE FUNCTION kairos_run_usage(run uuid) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT jsonb_object_agg(s.key, s.total)
              FROM (SELECT u.key, sum((u.value #>> '{}')::numeric) AS total
                      FROM effects e CROSS JOIN LATERAL jsonb_each(e.usage) AS u(key, value)
                     WHERE e.run_id = run AND e.state = 'settled' AND jsonb_typeof(e.usage) = 'object'
                       AND jsonb_typeof(u.value) = 'number'
                     GROUP BY u.key) AS s);
END;
$$;

CREATE OR REPLACE FUNCTION kairos_run_usage_with(run uuid, settling uuid, settling_usage jsonb) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT jsonb_object_agg(s.key, s.total)
              FROM (SELECT u.key, sum((u.value #>> '{}')::numeric) AS total
                      FROM (SELECT e.usage FROM effects e
                             WHERE e.run_id = run AND e.state = 'settled' AND e.id <> settling
                            UNION ALL
                            SELECT settling_usage) AS x (usage)
                     CROSS JOIN LATERAL jsonb_each(x.usage) AS u(key, value)
                     WHERE jsonb_typeof(x.usage) = 'object' AND jsonb_typeof(u.value) = 'number'
                     GROUP BY u.key) AS s);
END;
$$;
