-- Retention (Forget): past KAIROS_RETENTION_DAYS the tick's pruner
-- (kairos.tick.prune) deletes the entries of a run's own thread and clears its webhook payload. The
-- run, its occurrence and its trace stay; the run says when it was pruned, so the output projection
-- can answer `unavailable` (reason `pruned`) instead of pretending the answer never existed.

-- runs.pruned_at: when the pruner cleared this ended run's payload and, where the thread was the run's
-- alone, deleted its thread's entries. NULL until then; set once (the pruner only picks NULL rows).
ALTER TABLE runs ADD COLUMN pruned_at timestamptz;
ALTER TABLE runs ADD CONSTRAINT runs_pruned_after_finish CHECK (pruned_at IS NULL OR finished_at IS NOT NULL);

-- The pruner's scan: ended runs not pruned yet, oldest end first. Pruned rows leave the index, so it
-- holds at most the runs of the retention window plus the backlog.
CREATE INDEX runs_prunable_idx ON runs (finished_at) WHERE pruned_at IS NULL AND finished_at IS NOT NULL;

-- Conversation entries are append-only like the trace: nobody rewrites what was said, and only the
-- pruner deletes (after kairos_allow_pruning() in its transaction; 0004). UPDATE stays refused even
-- for the pruner: pruning removes rows, it never rewrites them.
CREATE TRIGGER conversation_entries_immutable BEFORE UPDATE ON conversation_entries
    FOR EACH ROW EXECUTE FUNCTION kairos_refuse_update();
CREATE TRIGGER conversation_entries_no_delete BEFORE DELETE ON conversation_entries
    FOR EACH STATEMENT EXECUTE FUNCTION kairos_refuse_delete();
CREATE TRIGGER conversation_entries_no_truncate BEFORE TRUNCATE ON conversation_entries
    FOR EACH STATEMENT EXECUTE FUNCTION kairos_refuse_delete();

COMMENT ON FUNCTION kairos_allow_pruning() IS
    'Lets the current transaction DELETE from occurrences, run_events and conversation_entries (the retention pruner only).';

-- The pruner keeps a run thread someone forked whole; forks are found by their parent.
CREATE INDEX conversations_parent_idx ON conversations (parent_id) WHERE parent_id IS NOT NULL;
