-- corpus_exports: one export per format and its multipart-upload checkpoint (upload id, parts done,
-- the last record key written), so a restart resumes the upload instead of starting over.

-- name: corpus_exports_open
-- The export's row, created once (the caller holds runs_corpus_lock).
INSERT INTO corpus_exports (run_id, format, bucket, key, updated_at)
VALUES (%(run_id)s, %(format)s, %(bucket)s, %(key)s, coalesce(%(now)s::timestamptz, now()))
    ON CONFLICT (run_id, format) DO NOTHING;

-- name: corpus_exports_get
-- One export's checkpoint.
SELECT * FROM corpus_exports WHERE run_id = %(run_id)s AND format = %(format)s;

-- name: corpus_exports_list
-- A run's exports, in format order.
SELECT * FROM corpus_exports WHERE run_id = %(run_id)s ORDER BY format DESC;

-- name: corpus_exports_checkpoint
-- The upload's progress: its id, the parts done, the last key written and the bytes so far.
UPDATE corpus_exports
   SET upload_id = %(upload_id)s, parts = %(parts)s, last_kind = %(last_kind)s, last_id = %(last_id)s,
       bytes = %(bytes)s, updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE run_id = %(run_id)s AND format = %(format)s AND NOT done
RETURNING format;

-- name: corpus_exports_finish
-- The upload is complete: its size and digest.
UPDATE corpus_exports
   SET done = true, bytes = %(bytes)s, sha256 = %(sha256)s, updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE run_id = %(run_id)s AND format = %(format)s
RETURNING *;
