-- Run worker and run reads (kairos.runs). Every write of a running run carries its fence: the
-- statement matches zero rows once another claim (or the tick's rescue) has moved the run on, and
-- the caller learns that from the empty result. Fenced statements lock the run row (FOR NO KEY
-- UPDATE, the strength of an ordinary UPDATE), so the fence they checked holds until commit.

-- name: runs_claim (prepared)
-- Moves one queued run to running for exactly one caller: fence + 1, attempt + 1, a fresh lease,
-- with run.claimed and the first step's step.started, in one statement (one row version of the
-- run; see kairos.trace). An append run targets its source conversation from here on; fork and
-- fresh get theirs from the worker. first_step names the step the run's executor performs.
-- Or refuses it, decided inside this same update from the run row it updates and its schedule (no
-- check-then-claim race), ending it without any call (DESIGN.md "The run"): `cancelled` when the
-- schedule is neither active nor completed (schedule_cancelled, else schedule_paused); `expired`
-- once expires_at has passed; `abandoned` (superseded) when a newer scheduled fire of the schedule
-- was already claimed. A refused run comes back in its terminal state with `refusal` (its reason
-- code, NULL for a claim) and its diagnosis from the `refusals` parameter (JSON text, parsed only
-- when a run is refused), its one terminal event run.<state> written here.
-- Cost: the new values are one row sub-select evaluated once per updated row (the verdict in it is
-- fenced by OFFSET 0, or the planner would copy its CASE, probe and all, into every column), so a
-- claim on time adds a schedule lookup and two index probes: the superseded probe walks only the
-- schedule's newer occurrences, which a run on time has none of. The schedule row is read, never
-- locked.
WITH changed AS (
    UPDATE runs AS r
       SET (state, fence, attempt, lease_token, lease_expires_at, heartbeat_at, started_at, conversation_id,
            unclaimed_handoffs, diagnosis, finished_at, last_seq, updated_at) = (
           SELECT CASE WHEN v.refusal IS NULL THEN 'running'
                       WHEN v.refusal = 'superseded' THEN 'abandoned'
                       WHEN v.refusal = 'expired' THEN 'expired'
                       ELSE 'cancelled' END,
                  r.fence + CASE WHEN v.refusal IS NULL THEN 1 ELSE 0 END,
                  r.attempt + CASE WHEN v.refusal IS NULL THEN 1 ELSE 0 END,
                  CASE WHEN v.refusal IS NULL THEN gen_random_uuid() END,
                  CASE WHEN v.refusal IS NULL
                       THEN coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(lease_seconds)s) END,
                  CASE WHEN v.refusal IS NULL THEN coalesce(%(now)s::timestamptz, now()) ELSE r.heartbeat_at END,
                  CASE WHEN v.refusal IS NULL THEN coalesce(r.started_at, coalesce(%(now)s::timestamptz, now()))
                       ELSE r.started_at END,
                  CASE WHEN v.refusal IS NULL
                       THEN coalesce(r.conversation_id, CASE WHEN r.mode = 'append' THEN r.source_conversation_id END)
                       ELSE r.conversation_id END,
                  CASE WHEN v.refusal IS NULL THEN 0 ELSE r.unclaimed_handoffs END,
                  CASE WHEN v.refusal IS NULL THEN r.diagnosis ELSE %(refusals)s::text::jsonb -> v.refusal END,
                  CASE WHEN v.refusal IS NULL THEN NULL ELSE coalesce(%(now)s::timestamptz, now()) END,
                  r.last_seq + CASE WHEN v.refusal IS NULL THEN 2 ELSE 1 END,
                  coalesce(%(now)s::timestamptz, now())
             FROM (SELECT CASE
                              WHEN s.status = 'cancelled' THEN 'schedule_cancelled'
                              WHEN s.status NOT IN ('active', 'completed') THEN 'schedule_paused'
                              WHEN r.expires_at <= coalesce(%(now)s::timestamptz, now()) THEN 'expired'
                              WHEN r.source = 'scheduled' AND EXISTS (
                                       SELECT 1
                                         FROM occurrences mine
                                         JOIN occurrences newer
                                           ON newer.schedule_id = mine.schedule_id AND newer.source = 'scheduled'
                                          AND newer.fire_at > mine.fire_at
                                         JOIN runs n ON n.occurrence_id = newer.id
                                        WHERE mine.id = r.occurrence_id
                                          AND n.started_at IS NOT NULL) THEN 'superseded'
                          END AS refusal
                     FROM schedules s
                    WHERE s.id = r.schedule_id
                   OFFSET 0) AS v)
     WHERE r.id = %(run_id)s
       AND r.state = 'queued'
       AND r.blocked_by_run_id IS NULL
       AND r.cancel_requested_at IS NULL
    RETURNING r.id, r.occurrence_id, r.schedule_id, r.owner, r.source, r.mode, r.state, r.attempt, r.max_attempts,
              r.fence, r.lease_expires_at, r.heartbeat_at, r.conversation_id, r.source_conversation_id, r.prompt,
              r.payload, r.agent, r.runtime_limit_seconds, r.last_seq,
              CASE WHEN r.state <> 'running' THEN NULL
                   WHEN r.agent ->> 'executor' = 'http' THEN 'http' ELSE 'model' END AS first_step,
              CASE WHEN r.state <> 'running' THEN r.diagnosis ->> 'reason_code' END AS refusal
), changed_events AS (
    -- A claim: run.claimed and step.started. A refusal: its one terminal event.
    INSERT INTO run_events (run_id, seq, type, at, attempt, fence, step, data)
    SELECT c.id, c.last_seq - e.back, e.type, coalesce(%(now)s::timestamptz, now()), c.attempt, c.fence,
           e.step, e.data
      FROM changed c
     CROSS JOIN LATERAL (VALUES
           (true, 1, 'run.claimed', NULL, jsonb_build_object('attempt', c.attempt, 'mode', c.mode)),
           (true, 0, 'step.started', c.first_step, jsonb_build_object('attempt', c.attempt)),
           (false, 0, 'run.' || c.state, NULL, jsonb_build_object('reason_code', c.refusal, 'by', 'claim'))
     ) AS e (claim, back, type, step, data)
     WHERE e.claim = (c.refusal IS NULL)
)
SELECT * FROM changed;

-- name: runs_get
-- One run by id, whoever owns it (the worker: an SQS message names a run, never an owner).
SELECT * FROM runs WHERE id = %(run_id)s;

-- name: runs_get_owned
-- One run of one owner; another owner's run is as absent as a missing one.
SELECT * FROM runs WHERE id = %(run_id)s AND owner = %(owner)s;

-- name: runs_lock_owned
-- One run of one owner, locked for a state change decided by the caller (cancel).
SELECT * FROM runs WHERE id = %(run_id)s AND owner = %(owner)s FOR NO KEY UPDATE;

-- name: runs_lock_fenced (prepared)
-- The step boundary: locks the run while the caller's fence holds and reports a cancel request.
SELECT id, fence, attempt, max_attempts, cancel_requested_at, conversation_id
  FROM runs
 WHERE id = %(run_id)s AND fence = %(fence)s AND state = 'running'
   FOR NO KEY UPDATE;

-- name: runs_set_conversation
-- Records the run's target conversation under the fence (a re-claim keeps the one already set).
UPDATE runs
   SET conversation_id = %(conversation_id)s,
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = %(run_id)s AND fence = %(fence)s AND state = 'running'
   AND (conversation_id IS NULL OR conversation_id = %(conversation_id)s)
RETURNING conversation_id;

-- name: runs_heartbeat (prepared)
-- Extends the lease of the fence holder and reads whether a cancel was requested. Committed without
-- waiting for the WAL flush (set_config(..., true) is SET LOCAL: this statement's own transaction, so
-- run it alone, in autocommit): a beat lost in a server crash only makes the lease look up to one
-- interval older, inside a lease six intervals long, and the fence makes even an early rescue safe.
UPDATE runs
   SET lease_expires_at = coalesce(%(now)s::timestamptz, now()) + make_interval(secs => %(lease_seconds)s),
       heartbeat_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = %(run_id)s AND fence = %(fence)s AND state = 'running'
   AND set_config('synchronous_commit', 'off', true) IS NOT NULL
RETURNING cancel_requested_at, lease_expires_at;

-- name: runs_succeed (prepared)
-- running -> succeeded with its output reference; never after a cancel request.
UPDATE runs
   SET last_seq = last_seq + jsonb_array_length(%(events)s::jsonb),
       state = 'succeeded',
       output = %(output)s,
       usage = %(usage)s,
       lease_token = NULL,
       lease_expires_at = NULL,
       finished_at = coalesce(%(now)s::timestamptz, now()),
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = %(run_id)s AND fence = %(fence)s AND state = 'running' AND cancel_requested_at IS NULL
RETURNING id, last_seq, attempt, fence;

-- name: runs_fail (prepared)
-- running -> failed with a closed diagnosis, by the fence holder.
UPDATE runs
   SET last_seq = last_seq + jsonb_array_length(%(events)s::jsonb),
       state = 'failed',
       diagnosis = %(diagnosis)s,
       usage = coalesce(%(usage)s, usage),
       lease_token = NULL,
       lease_expires_at = NULL,
       finished_at = coalesce(%(now)s::timestamptz, now()),
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = %(run_id)s AND fence = %(fence)s AND state = 'running'
RETURNING id, last_seq, attempt, fence;

-- name: runs_finish_cancelled (prepared)
-- running -> cancelled by the fence holder once it has seen the cancel request.
UPDATE runs
   SET last_seq = last_seq + jsonb_array_length(%(events)s::jsonb),
       state = 'cancelled',
       diagnosis = %(diagnosis)s,
       usage = coalesce(%(usage)s, usage),
       lease_token = NULL,
       lease_expires_at = NULL,
       finished_at = coalesce(%(now)s::timestamptz, now()),
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = %(run_id)s AND fence = %(fence)s AND state = 'running' AND cancel_requested_at IS NOT NULL
RETURNING id, last_seq, attempt, fence;

-- name: runs_requeue_retry (prepared)
-- running -> queued for another attempt: only within max_attempts and with no external mutation.
-- handoff_at = now: the worker re-sends the id with a delay; should that send fail, the tick's
-- repair sends it once the handoff is stale (a NULL would make the next tick send it at once).
UPDATE runs r
   SET last_seq = last_seq + jsonb_array_length(%(events)s::jsonb),
       state = 'queued',
       lease_token = NULL,
       lease_expires_at = NULL,
       handoff_at = coalesce(%(now)s::timestamptz, now()),
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE r.id = %(run_id)s AND r.fence = %(fence)s AND r.state = 'running'
   AND r.cancel_requested_at IS NULL
   AND r.attempt < r.max_attempts
   AND NOT EXISTS (SELECT 1 FROM effects e WHERE e.run_id = r.id AND e.mutation AND e.state <> 'failed')
RETURNING id, last_seq, attempt, fence;

-- name: runs_cancel_waiting
-- queued (or awaiting approval) -> cancelled at once: no worker holds the run.
UPDATE runs
   SET last_seq = last_seq + jsonb_array_length(%(events)s::jsonb),
       state = 'cancelled',
       cancel_requested_at = coalesce(cancel_requested_at, coalesce(%(now)s::timestamptz, now())),
       diagnosis = %(diagnosis)s,
       finished_at = coalesce(%(now)s::timestamptz, now()),
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = %(run_id)s AND state IN ('queued', 'awaiting_approval')
   AND (%(owner)s::text IS NULL OR owner = %(owner)s::text)
   AND (NOT %(requested_only)s::boolean OR cancel_requested_at IS NOT NULL)
RETURNING *;

-- name: runs_request_cancel
-- Marks a running run for cancellation; its worker ends it at the next heartbeat or step.
UPDATE runs
   SET last_seq = last_seq + jsonb_array_length(%(events)s::jsonb),
       cancel_requested_at = coalesce(%(now)s::timestamptz, now()),
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = %(run_id)s AND owner = %(owner)s AND state = 'running' AND cancel_requested_at IS NULL
RETURNING *;

-- name: conversations_lock_fenced (prepared)
-- Locks the run (fence held) and then its target conversation, so the next entry seq is stable.
SELECT c.id, c.fork_seq
  FROM runs r
  JOIN conversations c ON c.id = r.conversation_id
 WHERE r.id = %(run_id)s AND r.fence = %(fence)s AND r.state = 'running' AND c.id = %(conversation_id)s
   FOR NO KEY UPDATE;

-- name: conversation_entries_append_fenced (prepared)
-- Appends one entry written by a running run, numbered after the (fork-aware) last seq.
INSERT INTO conversation_entries (conversation_id, seq, role, content, run_id, created_at)
SELECT c.id,
       coalesce((SELECT max(e.seq) FROM conversation_entries e WHERE e.conversation_id = c.id), c.fork_seq, 0) + 1,
       %(role)s, %(content)s, %(run_id)s, coalesce(%(now)s::timestamptz, now())
  FROM conversations c
 WHERE c.id = %(conversation_id)s
   AND EXISTS (SELECT 1 FROM runs r
                WHERE r.id = %(run_id)s AND r.fence = %(fence)s AND r.state = 'running'
                  AND r.conversation_id = c.id)
RETURNING conversation_id, seq;

-- name: conversation_entries_find_for_run
-- The first entry of one role a run wrote into a conversation (the prompt on a later attempt).
SELECT seq FROM conversation_entries
 WHERE conversation_id = %(conversation_id)s AND run_id = %(run_id)s AND role = %(role)s
 ORDER BY seq
 LIMIT 1;

-- name: conversation_entries_get_output
-- The answer entry a run's output references, read through the owner's conversation.
SELECT e.content, e.created_at
  FROM conversation_entries e
  JOIN conversations c ON c.id = e.conversation_id
 WHERE e.conversation_id = %(conversation_id)s AND e.seq = %(entry_seq)s AND e.role = 'assistant'
   AND c.owner = %(owner)s;
