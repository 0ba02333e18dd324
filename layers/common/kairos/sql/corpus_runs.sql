-- corpus_runs: a corpus run's phase, and the run moves of pause and resume (kairos.corpus). Every
-- write of a running run's child state is made in a transaction that first locked the run row under
-- the writer's fence (runs_corpus_lock), so a worker that lost its lease writes nothing.

-- name: corpus_runs_start
-- The corpus run's row, created by the first attempt (the caller holds runs_corpus_lock).
INSERT INTO corpus_runs (run_id, owner, created_at, updated_at)
VALUES (%(run_id)s, %(owner)s, coalesce(%(now)s::timestamptz, now()), coalesce(%(now)s::timestamptz, now()))
    ON CONFLICT (run_id) DO NOTHING;

-- name: corpus_runs_get
-- A corpus run's row (the caller resolved the run owner-scoped, or holds its fence).
SELECT * FROM corpus_runs WHERE run_id = %(run_id)s;

-- name: corpus_runs_set_phase
-- One phase move, from the phase read (the caller holds runs_corpus_lock).
UPDATE corpus_runs
   SET phase = %(phase)s,
       items_total = coalesce(%(items_total)s::integer, items_total),
       partitions_total = coalesce(%(partitions_total)s::integer, partitions_total),
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE run_id = %(run_id)s AND phase = %(from_phase)s
RETURNING *;

