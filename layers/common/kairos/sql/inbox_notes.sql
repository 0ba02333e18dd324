-- inbox_notes: short notes kept per conversation (the 'notes' box pruned to the newest few).

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
