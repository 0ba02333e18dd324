-- corpus_records: what the partitions answered (corpus_outputs) and the canonical records reduce
-- merges from them by (kind, id). Written by the run's fence holder (runs_corpus_lock held).

-- name: corpus_records_reduce
-- Reduce: one canonical record per (kind, id), fields merged with later partitions (then later
-- lines) winning field by field; lineage lists the partitions and their item ranges. Idempotent.
INSERT INTO corpus_records (run_id, kind, id, data, lineage)
SELECT o.run_id, o.kind, o.id,
       (SELECT coalesce(jsonb_object_agg(f.key, f.value), '{}'::jsonb)
          FROM (SELECT DISTINCT ON (e.key) e.key, e.value
                  FROM corpus_outputs o2
                 CROSS JOIN LATERAL jsonb_each(o2.data) AS e
                 WHERE o2.run_id = o.run_id AND o2.kind = o.kind AND o2.id = o.id
                 ORDER BY e.key, o2.partition DESC, o2.line DESC) AS f),
       jsonb_build_object('partitions',
                          jsonb_agg(DISTINCT jsonb_build_object('n', p.n, 'items',
                                                                jsonb_build_array(p.first_ordinal, p.last_ordinal))))
  FROM corpus_outputs o
  JOIN corpus_partitions p ON p.run_id = o.run_id AND p.n = o.partition AND p.state = 'succeeded'
 WHERE o.run_id = %(run_id)s
 GROUP BY o.run_id, o.kind, o.id
    ON CONFLICT (run_id, kind, id) DO NOTHING;

-- name: corpus_records_page
-- One keyset page of the canonical records in (kind, id) order, strictly after the cursor.
SELECT kind, id, data, lineage
  FROM corpus_records
 WHERE run_id = %(run_id)s
   AND (%(after_kind)s::text IS NULL OR (kind, id) > (%(after_kind)s::text, %(after_id)s::text))
 ORDER BY kind, id
 LIMIT %(limit)s;

-- name: corpus_records_count
-- How many canonical records the run has.
SELECT count(*)::integer AS records FROM corpus_records WHERE run_id = %(run_id)s;
