-- corpus_items: a corpus run's manifest, every item in stable order (written by enumerate).

-- name: corpus_items_insert
-- One page of the manifest (a JSON array of {ordinal, key, digest, bytes}); a page written before a
-- crash is written again as nothing (the caller holds runs_corpus_lock).
INSERT INTO corpus_items (run_id, ordinal, key, digest, bytes)
SELECT %(run_id)s, i.ordinal, i.key, i.digest, i.bytes
  FROM jsonb_to_recordset(%(items)s::jsonb) AS i(ordinal integer, key text, digest text, bytes bigint)
    ON CONFLICT (run_id, ordinal) DO NOTHING;

-- name: corpus_items_range
-- The items of one partition, in order.
SELECT ordinal, key, digest, bytes
  FROM corpus_items
 WHERE run_id = %(run_id)s AND ordinal BETWEEN %(first)s AND %(last)s
 ORDER BY ordinal;

-- name: corpus_items_totals
-- How many items the manifest holds.
SELECT count(*)::integer AS items FROM corpus_items WHERE run_id = %(run_id)s;
