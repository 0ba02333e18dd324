-- conversations: transcripts' heads (owner, agent, fork parent and fork point).

-- name: conversations_lock_fenced (prepared)
-- Locks the run (fence held) and then its target conversation, so the next entry seq is stable; reads
-- the run's cancel request under that lock (the answer is published only without one).
SELECT c.id, c.fork_seq, r.cancel_requested_at
  FROM runs r
  JOIN conversations c ON c.id = r.conversation_id
 WHERE r.id = %(run_id)s AND r.fence = %(fence)s AND r.state = 'running' AND c.id = %(conversation_id)s
   FOR NO KEY UPDATE;

-- name: conversations_insert
-- Creates one root conversation (no parent) with its agent.
INSERT INTO conversations (id, owner, title, agent, origin_run_id, created_at)
VALUES (%(id)s, %(owner)s, %(title)s, %(agent)s, %(origin_run_id)s, coalesce(%(now)s::timestamptz, now()))
RETURNING *;

-- name: conversations_get
-- One conversation of one owner (a foreign row answers like a missing one).
SELECT * FROM conversations WHERE id = %(conversation_id)s AND owner = %(owner)s;

-- name: conversations_list_owned
-- One keyset page of an owner's conversations, newest first: (created_at, id) strictly below the
-- cursor (kairos.pages). With threads, roots and run threads alike; without, only those the owner
-- created (no origin run). Reads conversations_owner_idx; limit is the page size plus one.
SELECT id, owner, title, agent, parent_id, fork_seq, origin_run_id, created_at
  FROM conversations
 WHERE owner = %(owner)s
   AND (%(threads)s::boolean OR origin_run_id IS NULL)
   AND (%(before_at)s::timestamptz IS NULL
        OR (created_at, id) < (%(before_at)s::timestamptz, %(before_id)s::uuid))
 ORDER BY created_at DESC, id DESC
 LIMIT %(limit)s;

-- name: conversations_lock
-- Locks one conversation row (optionally only the owner's) so writers to it serialize.
-- FOR NO KEY UPDATE, not FOR UPDATE: it serializes appenders and schedule creates with each other
-- but does not block (or deadlock with) inserts that merely reference the row through a foreign key.
SELECT *
  FROM conversations
 WHERE id = %(conversation_id)s
   AND (%(owner)s::text IS NULL OR owner = %(owner)s::text)
   FOR NO KEY UPDATE;

-- name: conversations_lock_threads
-- Locks (skipping held ones) run threads the pruner is about to empty, so no schedule create or append
-- on one can interleave; the pruner's next statement then reads what such a writer committed.
SELECT id
  FROM conversations
 WHERE id = ANY(%(ids)s::uuid[])
   FOR NO KEY UPDATE SKIP LOCKED;

-- name: conversations_latest_seq
-- The seq of the last entry of the merged transcript (inherited entries count); 0 when empty.
SELECT coalesce(
           (SELECT max(e.seq) FROM conversation_entries e WHERE e.conversation_id = c.id),
           c.fork_seq,
           0
       ) AS latest_seq
  FROM conversations c
 WHERE c.id = %(conversation_id)s;

-- name: conversations_fork
-- Creates a fork at the parent's latest entry: parent + fork point, no entry is copied.
INSERT INTO conversations (id, owner, title, agent, parent_id, fork_seq, origin_run_id, created_at)
SELECT %(id)s,
       c.owner,
       c.title,
       c.agent,
       c.id,
       coalesce((SELECT max(e.seq) FROM conversation_entries e WHERE e.conversation_id = c.id), c.fork_seq, 0),
       %(origin_run_id)s::uuid,
       coalesce(%(now)s::timestamptz, now())
  FROM conversations c
 WHERE c.id = %(conversation_id)s
RETURNING *;

-- name: conversations_lineage_has_run
-- Whether the conversation or any ancestor was created by a run (origin_run_id set).
WITH RECURSIVE lineage (id, parent_id, origin_run_id, depth) AS (
    SELECT id, parent_id, origin_run_id, 0 FROM conversations WHERE id = %(conversation_id)s
    UNION ALL
    SELECT p.id, p.parent_id, p.origin_run_id, l.depth + 1
      FROM lineage l
      JOIN conversations p ON p.id = l.parent_id
     WHERE l.depth < 10000  -- parents always exist before children, so no cycle; the bound is a guard
)
SELECT coalesce(bool_or(origin_run_id IS NOT NULL), false) AS has_run FROM lineage;

-- name: conversations_find_titled
-- The oldest root conversation of an owner with this title whose agent calls base_url (the local
-- stack finds its demo-model conversation again on each start).
SELECT id
  FROM conversations
 WHERE owner = %(owner)s AND title = %(title)s AND parent_id IS NULL AND agent->>'base_url' = %(base_url)s
 ORDER BY created_at, id
 LIMIT 1;
