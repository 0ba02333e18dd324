-- corpus_outputs: what each succeeded partition answered, line by line (reduce's input).

-- name: corpus_outputs_insert
-- One succeeded partition's lines (a JSON array of {line, kind, id, data}).
INSERT INTO corpus_outputs (run_id, partition, line, kind, id, data)
SELECT %(run_id)s, %(n)s, o.line, o.kind, o.id, o.data
  FROM jsonb_to_recordset(%(lines)s::jsonb) AS o(line integer, kind text, id text, data jsonb)
    ON CONFLICT (run_id, partition, line) DO NOTHING;
