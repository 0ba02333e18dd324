-- name: run_events_append
-- Appends one trace event with the next gap-free seq. With a fence, only the current holder of a
-- running run may write (zero rows otherwise); without one (tick, API), any run may be written.
WITH bumped AS (
    UPDATE runs
       SET last_seq = last_seq + 1
     WHERE id = %(run_id)s
       AND (%(fence)s::bigint IS NULL OR (fence = %(fence)s::bigint AND state = 'running'))
 RETURNING id, last_seq, attempt, fence
)
INSERT INTO run_events (run_id, seq, type, at, attempt, fence, step, data)
SELECT id, last_seq, %(type)s, coalesce(%(now)s::timestamptz, now()), attempt, fence, %(step)s, %(data)s
  FROM bumped
RETURNING seq;
