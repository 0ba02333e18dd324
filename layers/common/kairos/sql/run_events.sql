-- run_events: each run's gap-free trace (seq from runs.last_seq, bumped in the same statement).

-- name: run_events_append (prepared)
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

-- name: run_events_page
-- One trace page after a seq; step.progress rows are folded into their step.started row.
SELECT e.seq, e.type, e.at, e.attempt, e.step, e.data,
       p.progress_count, p.last_progress_at
  FROM run_events e
  LEFT JOIN LATERAL (
      SELECT count(*) AS progress_count, max(pe.at) AS last_progress_at
        FROM run_events pe
       WHERE pe.run_id = e.run_id AND pe.type = 'step.progress'
         AND pe.step = e.step AND pe.fence = e.fence AND pe.seq > e.seq
  ) p ON e.type = 'step.started'
 WHERE e.run_id = %(run_id)s AND e.seq > %(after)s AND e.type <> 'step.progress'
 ORDER BY e.seq
 LIMIT %(limit)s;

-- name: run_events_with_change
-- Template for trace.change: the placeholder below becomes a named guarded "UPDATE runs ...
-- RETURNING id, last_seq, attempt, fence ..." that adds the number of events to last_seq; the
-- events (a JSON array of {type, step, data}) follow it, in order, in the same statement.
WITH changed AS (
    {change}
), appended AS (
    INSERT INTO run_events (run_id, seq, type, at, attempt, fence, step, data)
    SELECT c.id, c.last_seq - jsonb_array_length(%(events)s::jsonb) + e.ord, e.event ->> 'type',
           coalesce(%(now)s::timestamptz, now()), c.attempt, c.fence, e.event ->> 'step', e.event -> 'data'
      FROM changed c
     CROSS JOIN jsonb_array_elements(%(events)s::jsonb) WITH ORDINALITY AS e (event, ord)
)
SELECT * FROM changed;
