-- corpus_partitions: stable ranges of the manifest, each mapped by one model call per generation.
-- Every write is made by the run's fence holder (the caller holds runs_corpus_lock).

-- name: corpus_partitions_create
-- The partitions of the manifest: n-th holds ordinals [n * size, (n + 1) * size - 1].
INSERT INTO corpus_partitions (run_id, n, first_ordinal, last_ordinal, updated_at)
SELECT %(run_id)s, g.n, g.n * %(size)s, least((g.n + 1) * %(size)s, %(items)s) - 1, coalesce(%(now)s::timestamptz, now())
  FROM generate_series(0, ceil(%(items)s::numeric / %(size)s)::integer - 1) AS g(n)
    ON CONFLICT (run_id, n) DO NOTHING;

-- name: corpus_partitions_release_stale
-- A new attempt: partitions an earlier fence left running go back to pending (their answer, if it
-- was checkpointed, stays: the next call of that generation is not made again).
UPDATE corpus_partitions
   SET state = 'pending', lease_token = NULL, lease_expires_at = NULL,
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE run_id = %(run_id)s AND state = 'running';

-- name: corpus_partitions_next
-- The lowest pending partition, leased to the caller (one partition per caller at a time).
UPDATE corpus_partitions
   SET state = 'running', attempts = attempts + 1, lease_token = gen_random_uuid(),
       lease_expires_at = coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(lease_seconds)s),
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE (run_id, n) = (SELECT run_id, n FROM corpus_partitions
                       WHERE run_id = %(run_id)s AND state = 'pending'
                       ORDER BY n LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING *;

-- name: corpus_partitions_renew
-- Extends the leases of the partitions in flight under the run's fence (during their calls).
UPDATE corpus_partitions p
   SET lease_expires_at = coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(lease_seconds)s)
 WHERE p.run_id = %(run_id)s AND p.state = 'running' AND p.lease_token = ANY(%(tokens)s::uuid[])
   AND EXISTS (SELECT 1 FROM runs r WHERE r.id = %(run_id)s AND r.fence = %(fence)s AND r.state = 'running')
RETURNING n;

-- name: corpus_partitions_checkpoint
-- The completed answer of the partition's current generation (a restart replays it, never calls again).
UPDATE corpus_partitions
   SET answer = %(answer)s, answer_generation = generation, updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE run_id = %(run_id)s AND n = %(n)s AND lease_token = %(lease_token)s AND generation = %(generation)s
RETURNING n;

-- name: corpus_partitions_succeed
-- The partition's records are committed: succeeded (its answer checkpoint is kept as evidence).
UPDATE corpus_partitions
   SET state = 'succeeded', lease_token = NULL, lease_expires_at = NULL, records = %(records)s,
       error_code = NULL, updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE run_id = %(run_id)s AND n = %(n)s AND lease_token = %(lease_token)s
RETURNING n, generation;

-- name: corpus_partitions_repair
-- An invalid answer: the next repair generation (a new input identity), pending again, its answer
-- cleared; or failed once the repairs are spent.
UPDATE corpus_partitions
   SET state = CASE WHEN generation < %(max_generation)s THEN 'pending' ELSE 'failed' END,
       generation = CASE WHEN generation < %(max_generation)s THEN generation + 1 ELSE generation END,
       answer = CASE WHEN generation < %(max_generation)s THEN NULL ELSE answer END,
       answer_generation = CASE WHEN generation < %(max_generation)s THEN NULL ELSE answer_generation END,
       error_code = %(error_code)s, lease_token = NULL, lease_expires_at = NULL,
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE run_id = %(run_id)s AND n = %(n)s AND lease_token = %(lease_token)s
RETURNING n, state, generation;

-- name: corpus_partitions_fail
-- The partition cannot be mapped (its source changed, its call failed for good): failed.
UPDATE corpus_partitions
   SET state = 'failed', error_code = %(error_code)s, lease_token = NULL, lease_expires_at = NULL,
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE run_id = %(run_id)s AND n = %(n)s AND lease_token = %(lease_token)s
RETURNING n, generation;

-- name: corpus_partitions_release
-- The partition goes back to pending untouched (a pause, a cancel or a retry-safe call failure).
UPDATE corpus_partitions
   SET state = 'pending', lease_token = NULL, lease_expires_at = NULL,
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE run_id = %(run_id)s AND n = %(n)s AND lease_token = %(lease_token)s
RETURNING n;

-- name: corpus_partitions_counts
-- Partitions by state, and the items the succeeded ones cover.
SELECT count(*)::integer AS total,
       count(*) FILTER (WHERE state = 'succeeded')::integer AS succeeded,
       count(*) FILTER (WHERE state = 'failed')::integer AS failed,
       count(*) FILTER (WHERE state = 'pending')::integer AS pending,
       count(*) FILTER (WHERE state = 'running')::integer AS running,
       coalesce(sum(last_ordinal - first_ordinal + 1) FILTER (WHERE state = 'succeeded'), 0)::integer AS covered
  FROM corpus_partitions
 WHERE run_id = %(run_id)s;
