-- Append-only for real (the record, and retention's Forget): occurrences and run_events
-- already refuse UPDATE (0001); they now refuse DELETE and TRUNCATE too. An ad-hoc
-- `DELETE FROM run_events` would otherwise rewrite the history the trace promises nobody can rewrite.
--
-- The one exception is the retention pruner. It calls kairos_allow_pruning() first, in the same
-- transaction as its DELETEs: the function sets the transaction-local setting kairos.pruning, which
-- ends with the transaction (commit or rollback), so the permission never leaks to the next
-- transaction on a pooled connection. UPDATE stays refused even then: pruning removes rows, it never
-- rewrites them.
--
-- Statement-level triggers: one check per DELETE however many rows it removes (the pruner works in
-- batches), and TRUNCATE (which fires no row triggers) is covered the same way.

CREATE FUNCTION kairos_allow_pruning() RETURNS void LANGUAGE sql AS $$
    SELECT set_config('kairos.pruning', 'on', true)
$$;

COMMENT ON FUNCTION kairos_allow_pruning() IS
    'Lets the current transaction DELETE from occurrences and run_events (the retention pruner only).';

CREATE FUNCTION kairos_refuse_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(current_setting('kairos.pruning', true), '') = 'on' THEN
        RETURN NULL;
    END IF;
    RAISE EXCEPTION '% rows are append-only: % is refused outside the retention pruner', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'restrict_violation',
              HINT = 'the pruner calls kairos_allow_pruning() in its transaction first';
END;
$$;

CREATE TRIGGER occurrences_no_delete BEFORE DELETE ON occurrences
    FOR EACH STATEMENT EXECUTE FUNCTION kairos_refuse_delete();
CREATE TRIGGER occurrences_no_truncate BEFORE TRUNCATE ON occurrences
    FOR EACH STATEMENT EXECUTE FUNCTION kairos_refuse_delete();
CREATE TRIGGER run_events_no_delete BEFORE DELETE ON run_events
    FOR EACH STATEMENT EXECUTE FUNCTION kairos_refuse_delete();
CREATE TRIGGER run_events_no_truncate BEFORE TRUNCATE ON run_events
    FOR EACH STATEMENT EXECUTE FUNCTION kairos_refuse_delete();
