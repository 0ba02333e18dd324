-- run_events: each run's gap-free trace (seq from runs.last_seq, bumped in the same statement), a view
-- of run_event_batches: a writing statement stores its events as one batch row (migration 0034).

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
INSERT INTO run_event_batches (run_id, last_seq, at, attempt, fence, events)
SELECT id, last_seq, coalesce(%(now)s::timestamptz, now()), attempt, fence,
       jsonb_build_array(jsonb_build_object('type', %(type)s::text, 'step', %(step)s::text, 'data', %(data)s::jsonb))
  FROM bumped
RETURNING last_seq AS seq;

-- name: run_events_page
-- One trace page after a seq; step.progress rows are folded into their step.started row. Reads the
-- batches (not the view) so that only those past the cursor are expanded, in key order.
SELECT e.seq, e.type, e.at, e.attempt, e.step, e.data,
       p.progress_count, p.last_progress_at
  FROM (SELECT b.run_id, b.last_seq, x.ord, b.at, b.attempt, b.fence,
               (b.last_seq - jsonb_array_length(b.events) + x.ord)::integer AS seq,
               x.event ->> 'type' AS type, x.event ->> 'step' AS step,
               coalesce(x.event -> 'data', '{}'::jsonb) AS data
          FROM run_event_batches b
         CROSS JOIN LATERAL jsonb_array_elements(b.events) WITH ORDINALITY AS x (event, ord)
         WHERE b.run_id = %(run_id)s AND b.last_seq > %(after)s) AS e
  LEFT JOIN LATERAL (
      SELECT count(*) AS progress_count, max(pb.at) AS last_progress_at
        FROM run_event_batches pb
       CROSS JOIN LATERAL jsonb_array_elements(pb.events) WITH ORDINALITY AS px (event, ord)
       WHERE pb.run_id = e.run_id AND pb.last_seq > e.seq AND pb.fence = e.fence
         AND px.event ->> 'type' = 'step.progress' AND px.event ->> 'step' = e.step
         AND pb.last_seq - jsonb_array_length(pb.events) + px.ord > e.seq
  ) p ON e.type = 'step.started'
 WHERE e.seq > %(after)s AND e.type <> 'step.progress'
 ORDER BY e.last_seq, e.ord
 LIMIT %(limit)s;

-- name: run_events_with_change
-- Template for trace.change: the placeholder below becomes a named guarded "UPDATE runs ...
-- RETURNING id, last_seq, attempt, fence ..." that adds the number of events to last_seq; the
-- events (a JSON array of {type, step, data}) follow it, in order, in the same statement: one batch
-- ending at the bumped last_seq (none when the array is empty).
WITH changed AS (
    {change}
), appended AS (
    INSERT INTO run_event_batches (run_id, last_seq, at, attempt, fence, events)
    SELECT c.id, c.last_seq, coalesce(%(now)s::timestamptz, now()), c.attempt, c.fence, %(events)s::jsonb
      FROM changed c
     WHERE jsonb_array_length(%(events)s::jsonb) > 0
)
SELECT * FROM changed;
