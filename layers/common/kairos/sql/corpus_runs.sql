-- corpus_runs: a corpus run's phase, and the run moves of pause and resume (kairos.corpus). Every
-- write of a running run's child state is made in a transaction that first locked the run row under
-- the writer's fence (runs_corpus_lock), so a worker that lost its lease writes nothing.

-- name: runs_corpus_lock
-- The partition boundary: locks the running run while the caller's fence holds; reports a cancel
-- and a pause request.
SELECT id, fence, attempt, owner, cancel_requested_at, pause_requested_at
  FROM runs
 WHERE id = %(run_id)s AND fence = %(fence)s AND state = 'running'
   FOR NO KEY UPDATE;

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

-- name: runs_corpus_pause
-- running -> queued at a partition boundary after a pause request, by the fence holder: the lease
-- cleared, paused_at set (the claim skips it and the repair does not re-send it), no expiry while
-- paused; run.paused follows in the same statement (kairos.trace.change).
UPDATE runs
   SET last_seq = last_seq + jsonb_array_length(%(events)s::jsonb),
       state = 'queued',
       lease_token = NULL,
       lease_expires_at = NULL,
       paused_at = coalesce(%(now)s::timestamptz, now()),
       pause_requested_at = NULL,
       expires_at = NULL,
       handoff_at = coalesce(%(now)s::timestamptz, now()),
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = %(run_id)s AND fence = %(fence)s AND state = 'running'
   AND pause_requested_at IS NOT NULL AND cancel_requested_at IS NULL
RETURNING id, last_seq, attempt, fence;

-- name: runs_corpus_request_pause
-- The owner asks a running corpus run to pause: its worker stops at the next partition boundary.
UPDATE runs
   SET pause_requested_at = coalesce(%(now)s::timestamptz, now()),
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = %(run_id)s AND owner = %(owner)s AND state = 'running' AND corpus IS NOT NULL
   AND cancel_requested_at IS NULL
RETURNING *;

-- name: runs_corpus_pause_queued
-- The owner pauses a queued corpus run: it stays queued, paused (not claimed, not re-sent, no
-- expiry), with run.paused in the same statement. A paused run answers again (idempotent) without
-- an event: zero events, last_seq unchanged.
UPDATE runs
   SET last_seq = last_seq + jsonb_array_length(%(events)s::jsonb),
       paused_at = coalesce(paused_at, coalesce(%(now)s::timestamptz, now())),
       expires_at = NULL,
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = %(run_id)s AND owner = %(owner)s AND state = 'queued' AND corpus IS NOT NULL
   AND cancel_requested_at IS NULL
RETURNING *;

-- name: runs_corpus_resume
-- The owner resumes a paused corpus run (or withdraws a pause request not yet reached): paused_at
-- and the request cleared, run.resumed in the same statement; the caller sends a queued one to SQS.
UPDATE runs
   SET last_seq = last_seq + jsonb_array_length(%(events)s::jsonb),
       paused_at = NULL,
       pause_requested_at = NULL,
       handoff_at = NULL,
       unclaimed_handoffs = 0,
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = %(run_id)s AND owner = %(owner)s AND corpus IS NOT NULL
   AND state IN ('queued', 'running')
   AND (paused_at IS NOT NULL OR pause_requested_at IS NOT NULL)
RETURNING *;
