-- conversation_entries: a conversation's own entries; a fork's transcript merges its ancestors' up
-- to each fork point (no entry is copied).

-- name: conversation_entries_append_fenced (prepared)
-- Appends one entry written by a running run, numbered after the (fork-aware) last seq.
INSERT INTO conversation_entries (conversation_id, seq, role, content, run_id, created_at)
SELECT c.id,
       coalesce((SELECT max(e.seq) FROM conversation_entries e WHERE e.conversation_id = c.id), c.fork_seq, 0) + 1,
       %(role)s, %(content)s, %(run_id)s, coalesce(%(now)s::timestamptz, now())
  FROM conversations c
 WHERE c.id = %(conversation_id)s
   AND EXISTS (SELECT 1 FROM runs r
                WHERE r.id = %(run_id)s AND r.fence = %(fence)s AND r.state = 'running'
                  AND r.conversation_id = c.id)
RETURNING conversation_id, seq;

-- name: conversation_entries_find_for_run
-- The first entry of one role a run wrote into a conversation (the prompt on a later attempt).
SELECT seq FROM conversation_entries
 WHERE conversation_id = %(conversation_id)s AND run_id = %(run_id)s AND role = %(role)s
 ORDER BY seq
 LIMIT 1;

-- name: conversation_entries_find_retried_prompt
-- A retry's chain (the run, the run it retries, that one's, …: at most 100) and whether one of them
-- already wrote its user entry (the prompt) into the conversation: a retry asks that entry again and
-- does not write a second one.
WITH RECURSIVE chain (id, retry_of, depth) AS (
    SELECT id, retry_of, 0 FROM runs WHERE id = %(run_id)s
    UNION ALL
    SELECT r.id, r.retry_of, c.depth + 1 FROM chain c JOIN runs r ON r.id = c.retry_of WHERE c.depth < 100
)
SELECT array_agg(c.id ORDER BY c.depth) AS run_ids,
       coalesce(bool_or(EXISTS (SELECT 1 FROM conversation_entries e
                                 WHERE e.conversation_id = %(conversation_id)s AND e.run_id = c.id
                                   AND e.role = 'user')), false) AS prompted
  FROM chain c;

-- name: conversation_entries_get_output
-- The answer entry a run's output references, read through the owner's conversation.
SELECT e.content, e.created_at
  FROM conversation_entries e
  JOIN conversations c ON c.id = e.conversation_id
 WHERE e.conversation_id = %(conversation_id)s AND e.seq = %(entry_seq)s AND e.role = 'assistant'
   AND c.owner = %(owner)s;

-- name: conversation_entries_list
-- The merged transcript: each ancestor's entries up to the fork point below it, then its own.
-- upto is the smallest fork point met on the way up; least() ignores the NULL of the starting row.
WITH RECURSIVE lineage (id, parent_id, fork_seq, upto, depth) AS (
    SELECT id, parent_id, fork_seq, NULL::integer, 0 FROM conversations WHERE id = %(conversation_id)s
    UNION ALL
    SELECT p.id, p.parent_id, p.fork_seq, least(l.upto, l.fork_seq), l.depth + 1
      FROM lineage l
      JOIN conversations p ON p.id = l.parent_id
     WHERE l.depth < 10000
)
SELECT e.seq, e.role, e.content, e.run_id, e.created_at
  FROM lineage l
  JOIN conversation_entries e ON e.conversation_id = l.id
 WHERE l.upto IS NULL OR e.seq <= l.upto
 ORDER BY e.seq, l.depth;

-- name: conversation_entries_window (prepared)
-- The newest entries of the merged transcript that fit a budget of characters, oldest first, without
-- the given runs' own entries (the run's, and those of the runs it retries: bounded model input, docs/api.md "API", max_input_tokens). An entry costs its length
-- plus a fixed overhead (its framing), so at most budget / overhead + 1 of the newest entries are
-- measured, and only the ones that fit are returned: the transcript is never read whole. The kept
-- entries are a contiguous newest run (the running sum only grows), never a gap-filled selection.
-- Every row carries the number of entries left out; when none fits, one row with a NULL seq.
-- Each member of the lineage and its entries are read by their primary keys (a LIMITed LATERAL
-- subquery, a correlated count), newest first: an index scan per ancestor whatever the tables'
-- statistics say (plain joins let a young table's generic plan scan every conversation's entries).
WITH RECURSIVE lineage (id, parent_id, fork_seq, upto, depth) AS (
    SELECT id, parent_id, fork_seq, NULL::integer, 0 FROM conversations WHERE id = %(conversation_id)s
    UNION ALL
    SELECT p.id, p.parent_id, p.fork_seq, least(l.upto, l.fork_seq), l.depth + 1
      FROM lineage l
     CROSS JOIN LATERAL (SELECT c.id, c.parent_id, c.fork_seq FROM conversations c WHERE c.id = l.parent_id
                         LIMIT 1) p
     WHERE l.depth < 10000
), newest AS (
    SELECT n.seq, n.role, n.content, n.run_id, n.created_at,
           sum(length(n.content) + %(overhead)s::integer) OVER (ORDER BY n.seq DESC) AS used
      FROM (SELECT e.seq, e.role, e.content, e.run_id, e.created_at
              FROM lineage l
             CROSS JOIN LATERAL (
                   SELECT e.seq, e.role, e.content, e.run_id, e.created_at
                     FROM conversation_entries e
                    WHERE e.conversation_id = l.id AND e.seq <= coalesce(l.upto, 2147483647)
                      AND (e.run_id IS NULL OR e.run_id <> ALL (%(run_ids)s::uuid[]))
                    ORDER BY e.seq DESC
                    LIMIT greatest(%(budget)s::integer, 0) / %(overhead)s::integer + 1) e
             ORDER BY e.seq DESC
             LIMIT greatest(%(budget)s::integer, 0) / %(overhead)s::integer + 1) n
), kept AS (
    SELECT seq, role, content, run_id, created_at FROM newest WHERE used <= %(budget)s::integer
), total AS (
    SELECT coalesce(sum((SELECT count(*) FROM conversation_entries e
                          WHERE e.conversation_id = l.id AND e.seq <= coalesce(l.upto, 2147483647)
                            AND (e.run_id IS NULL OR e.run_id <> ALL (%(run_ids)s::uuid[])))), 0)
           AS entries
      FROM lineage l
)
SELECT t.entries - (SELECT count(*) FROM kept) AS elided, k.seq, k.role, k.content, k.run_id, k.created_at
  FROM total t
  LEFT JOIN kept k ON true
 ORDER BY k.seq;

-- name: conversation_entries_allow_pruning
-- Lets this transaction delete entries (the triggers refuse it otherwise); ends with the transaction.
SELECT kairos_allow_pruning();

-- name: conversation_entries_prune_threads
-- Deletes the entries of run threads (pairs of run and thread the caller holds locked) that are still
-- the run's alone: every entry written by that run, no fork of the thread, no schedule on it. A run
-- reads or writes a conversation other than its own thread only as its schedule's conversation, so
-- "no schedule" also means no other run uses it. A thread someone built on is kept whole.
DELETE FROM conversation_entries e
 USING unnest(%(run_ids)s::uuid[], %(thread_ids)s::uuid[]) AS t (run_id, thread_id)
 WHERE e.conversation_id = t.thread_id
   AND NOT EXISTS (SELECT 1 FROM conversation_entries o
                    WHERE o.conversation_id = t.thread_id AND o.run_id IS DISTINCT FROM t.run_id)
   AND NOT EXISTS (SELECT 1 FROM conversations k WHERE k.parent_id = t.thread_id)
   AND NOT EXISTS (SELECT 1 FROM schedules s WHERE s.conversation_id = t.thread_id)
RETURNING e.conversation_id;

-- name: conversation_entries_append
-- Appends one entry at the next seq of the merged transcript; the caller holds conversations_lock.
INSERT INTO conversation_entries (conversation_id, seq, role, content, run_id, created_at)
SELECT c.id,
       coalesce((SELECT max(e.seq) FROM conversation_entries e WHERE e.conversation_id = c.id), c.fork_seq, 0) + 1,
       %(role)s,
       %(content)s,
       %(run_id)s::uuid,
       coalesce(%(now)s::timestamptz, now())
  FROM conversations c
 WHERE c.id = %(conversation_id)s
RETURNING seq, role, content, run_id, created_at;

-- name: conversation_entries_find_seq
-- One entry of a conversation by its seq (a loop run reads its owner's answer; kairos.execution.goal_report).
SELECT seq, role, content, run_id, created_at
  FROM conversation_entries
 WHERE conversation_id = %(conversation_id)s AND seq = %(seq)s;
