-- name: conversations_insert
-- Creates one root conversation (no parent) with its agent.
INSERT INTO conversations (id, owner, title, agent, origin_run_id, created_at)
VALUES (%(id)s, %(owner)s, %(title)s, %(agent)s, %(origin_run_id)s, coalesce(%(now)s::timestamptz, now()))
RETURNING *;

-- name: conversations_get
-- One conversation of one owner (a foreign row answers like a missing one).
SELECT * FROM conversations WHERE id = %(conversation_id)s AND owner = %(owner)s;

-- name: conversations_lock
-- Locks one conversation row (optionally only the owner's) so writers to it serialize.
-- FOR NO KEY UPDATE, not FOR UPDATE: it serializes appenders and schedule creates with each other
-- but does not block (or deadlock with) inserts that merely reference the row through a foreign key.
SELECT *
  FROM conversations
 WHERE id = %(conversation_id)s
   AND (%(owner)s::text IS NULL OR owner = %(owner)s::text)
   FOR NO KEY UPDATE;

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

-- name: conversation_entries_window
-- The newest entries of the merged transcript that fit a budget of characters, oldest first, without
-- the given run's own entries (bounded model input, DESIGN.md "The run"). An entry costs its length
-- plus a fixed overhead (its framing), so at most budget / overhead + 1 of the newest entries are
-- measured, and only the ones that fit are returned: the transcript is never read whole. The kept
-- entries are a contiguous newest run (the running sum only grows), never a gap-filled selection.
-- Every row carries the number of entries left out; when none fits, one row with a NULL seq.
WITH RECURSIVE lineage (id, parent_id, fork_seq, upto, depth) AS (
    SELECT id, parent_id, fork_seq, NULL::integer, 0 FROM conversations WHERE id = %(conversation_id)s
    UNION ALL
    SELECT p.id, p.parent_id, p.fork_seq, least(l.upto, l.fork_seq), l.depth + 1
      FROM lineage l
      JOIN conversations p ON p.id = l.parent_id
     WHERE l.depth < 10000
), newest AS (
    SELECT n.seq, n.role, n.content, n.run_id, n.created_at,
           sum(length(n.content) + %(overhead)s::integer) OVER (ORDER BY n.seq DESC) AS used
      FROM (SELECT e.seq, e.role, e.content, e.run_id, e.created_at
              FROM lineage l
              JOIN conversation_entries e ON e.conversation_id = l.id
             WHERE (l.upto IS NULL OR e.seq <= l.upto)
               AND (%(run_id)s::uuid IS NULL OR e.run_id IS DISTINCT FROM %(run_id)s::uuid)
             ORDER BY e.seq DESC
             LIMIT greatest(%(budget)s::integer, 0) / %(overhead)s::integer + 1) n
), kept AS (
    SELECT seq, role, content, run_id, created_at FROM newest WHERE used <= %(budget)s::integer
), total AS (
    SELECT count(*) AS entries
      FROM lineage l
      JOIN conversation_entries e ON e.conversation_id = l.id
     WHERE (l.upto IS NULL OR e.seq <= l.upto)
       AND (%(run_id)s::uuid IS NULL OR e.run_id IS DISTINCT FROM %(run_id)s::uuid)
)
SELECT t.entries - (SELECT count(*) FROM kept) AS elided, k.seq, k.role, k.content, k.run_id, k.created_at
  FROM total t
  LEFT JOIN kept k ON true
 ORDER BY k.seq;

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

-- name: inbox_notes_add
-- Adds a note to the 'notes' box and prunes that box to the newest keep ('queued' untouched).
-- The prune runs in the same statement and cannot see the new row, so it keeps keep - 1 older notes.
-- A missing conversation inserts nothing and therefore prunes nothing.
WITH added AS (
    INSERT INTO inbox_notes (conversation_id, box, kind, body, created_at)
    SELECT c.id, 'notes', %(kind)s, %(body)s, coalesce(%(now)s::timestamptz, now())
      FROM conversations c
     WHERE c.id = %(conversation_id)s
    RETURNING id, conversation_id
), pruned AS (
    DELETE FROM inbox_notes n
     USING added a
     WHERE n.conversation_id = a.conversation_id
       AND n.box = 'notes'
       AND n.id NOT IN (
           SELECT k.id
             FROM inbox_notes k
            WHERE k.conversation_id = a.conversation_id AND k.box = 'notes'
            ORDER BY k.id DESC
            LIMIT greatest(%(keep)s::integer - 1, 0)
       )
    RETURNING n.id
)
SELECT (SELECT id FROM added) AS id, (SELECT count(*) FROM pruned) AS pruned;

-- name: inbox_notes_list
-- Every note of a conversation, both boxes, newest first.
SELECT id, box, kind, body, created_at
  FROM inbox_notes
 WHERE conversation_id = %(conversation_id)s
 ORDER BY id DESC;
