-- runs: one row per execution of a prompt, with its state, fence, lease and handoff columns.
-- Writers: the tick (fire inserts queued runs through occurrences_insert; settle marks ended
-- runs settled; repair releases blocked runs, fails undeliverable ones and rescues expired leases),
-- the webhook intake (occurrences_insert too), the handoff stamp, the run worker and the API's cancel.
-- Every write of a running run carries its fence: the statement matches zero rows once another claim
-- (or the tick's rescue) has moved the run on, and the caller learns that from the empty result.
-- Fenced statements lock the run row (FOR NO KEY UPDATE, the strength of an ordinary UPDATE), so the
-- fence they checked holds until commit. Row locks taken to split work between ticks use SKIP LOCKED.
-- The runs_ops_* reads serve operators (kairos.operations). State moves: kairos.states.RUN_MOVES.

-- name: runs_claim (prepared)
-- Moves one queued run to running for exactly one caller: fence + 1, attempt + 1, a fresh lease,
-- with run.claimed and the first step's step.started, in one statement (one row version of the
-- run; see kairos.trace). An append run targets its source conversation from here on. A fork run's
-- first attempt gets its thread here too, when the worker names one (`thread_id`) and the source
-- still exists: the thread (a fork of the source at its latest entry) and the run's prompt entry in
-- it are inserted by this same statement (`forked` comes back true) — nobody else can write to a
-- thread that does not exist before this commits, so no conversation lock is needed. Otherwise
-- (fresh, a later attempt, no thread_id) the worker prepares the target. first_step names the step
-- the run's executor performs.
-- Only a run that holds one of its owner's slots (admitted_at, migration 0030), or one its owner has a
-- slot to spare for (awaiting_approval and awaiting_input hold none); otherwise zero rows, and the
-- caller finds the run still queued: it waits for its release, no message is sent for it.
-- Or refuses it, decided inside this same update from the run row it updates and its schedule (no
-- check-then-claim race), ending it without any call (docs/api.md "API": catch_up, max_delay_seconds): `cancelled` when the
-- schedule is neither active nor completed (schedule_cancelled, else schedule_paused; a loop run of a
-- revision older than the loop's goal: goal_revised; the run a paused loop waits on is let through); `expired`
-- once expires_at has passed; `abandoned` (superseded) when a newer scheduled fire of the schedule
-- was already claimed. A refused run comes back in its terminal state with `refusal` (its reason
-- code, NULL for a claim) and its diagnosis from the `refusals` parameter (JSON text, parsed only
-- when a run is refused), its one terminal event run.<state> written here.
-- Cost: the new values are one row sub-select evaluated once per updated row (the verdict in it is
-- fenced by OFFSET 0, or the planner would copy its CASE, probe and all, into every column), so a
-- claim on time adds a schedule lookup and two index probes: the superseded probe walks only the
-- schedule's newer occurrences, which a run on time has none of. The schedule row is read, never
-- locked.
-- With `window_budget` (characters; NULL: none), a forked thread's model input window comes back on the
-- row (`window_entries`: [seq, role, content, run_id, created_at] oldest first; `window_elided`), read
-- as conversation_entries_window reads the thread without the run's own entries: the source's
-- entries up to the fork point, which in this statement's snapshot are all of the source's — the
-- fork point (`thread`) is their max seq in the same snapshot. One statement, so no second one in the
-- claim's trip. The window's CTEs repeat conversation_entries_window's; tests/db/test_runs_model_input.py
-- (test_the_fork_claims_window_is_the_threads_window) holds the two answers equal.
WITH RECURSIVE changed AS (
    UPDATE runs AS r
       SET (state, fence, attempt, lease_token, lease_expires_at, heartbeat_at, started_at, conversation_id,
            unclaimed_handoffs, diagnosis, finished_at, last_seq, updated_at, admitted_at, released_by) = (
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
                       THEN coalesce(r.conversation_id, CASE WHEN r.mode = 'append' THEN r.source_conversation_id
                                                             WHEN v.forks THEN %(thread_id)s::uuid END)
                       ELSE r.conversation_id END,
                  CASE WHEN v.refusal IS NULL THEN 0 ELSE r.unclaimed_handoffs END,
                  CASE WHEN v.refusal IS NULL THEN r.diagnosis ELSE %(refusals)s::text::jsonb -> v.refusal END,
                  CASE WHEN v.refusal IS NULL THEN NULL ELSE coalesce(%(now)s::timestamptz, now()) END,
                  r.last_seq + CASE WHEN v.refusal IS NULL THEN 2 ELSE 1 END,
                  coalesce(%(now)s::timestamptz, now()),
                  -- A claim holds its slot from here (a refusal gives it up: runs_give_up_slot).
                  coalesce(r.admitted_at, coalesce(%(now)s::timestamptz, now())),
                  CASE WHEN v.refusal IS NULL THEN NULL ELSE r.released_by END
             FROM (SELECT CASE
                              WHEN s.status = 'cancelled' THEN 'schedule_cancelled'
                              -- A loop run made under an older goal than the loop's (kairos.schedules.loops).
                              WHEN s.loop AND (SELECT o.schedule_revision FROM occurrences o
                                                WHERE o.id = r.occurrence_id) < s.goal_revision
                                   THEN 'goal_revised'
                              -- The run a loop paused for, requeued by its owner's answer, goes through.
                              WHEN s.input_run_id = r.id THEN NULL
                              -- A test run may try a paused schedule before it is resumed.
                              WHEN s.status NOT IN ('active', 'completed') AND NOT r.test THEN 'schedule_paused'
                              WHEN r.expires_at <= coalesce(%(now)s::timestamptz, now()) THEN 'expired'
                              -- The newer occurrences' runs are read one by one, by occurrence: joined, the
                              -- planner could start from "runs that started", which statistics taken while
                              -- none had started put at one row, and read every run (a first burst).
                              WHEN r.source = 'scheduled' AND EXISTS (
                                       SELECT 1
                                         FROM occurrences mine
                                         JOIN occurrences newer
                                           ON newer.schedule_id = mine.schedule_id AND newer.source = 'scheduled'
                                          AND newer.fire_at > mine.fire_at
                                        WHERE mine.id = r.occurrence_id
                                          AND (SELECT n.started_at FROM runs n WHERE n.occurrence_id = newer.id)
                                              IS NOT NULL) THEN 'superseded'
                          END AS refusal,
                          %(thread_id)s::uuid IS NOT NULL AND r.mode = 'fork' AND r.attempt = 0
                              AND r.conversation_id IS NULL
                              AND EXISTS (SELECT 1 FROM conversations src WHERE src.id = r.source_conversation_id)
                              AS forks
                     FROM (SELECT 1) AS one
                     LEFT JOIN schedules s ON s.id = r.schedule_id  -- a chat turn has no schedule
                   OFFSET 0) AS v)
     WHERE r.id = %(run_id)s
       AND r.state = 'queued'
       AND r.blocked_by_run_id IS NULL
       AND r.cancel_requested_at IS NULL
       AND r.paused_at IS NULL  -- a paused corpus run waits for its resume (kairos.runs.corpus_control)
       -- A webhook run held by its flow (a window still open, a delivery deferred by the rate: kairos.flow).
       AND (r.held_until IS NULL OR r.held_until <= coalesce(%(now)s::timestamptz, now()))
       -- fork_only: only a fork run's first attempt whose source exists (it needs nothing but this
       -- statement, so the caller may send its COMMIT behind it); any other run is left queued.
       AND (NOT %(fork_only)s::boolean
            OR (r.mode = 'fork' AND r.attempt = 0 AND r.conversation_id IS NULL
                AND EXISTS (SELECT 1 FROM conversations src WHERE src.id = r.source_conversation_id)))
       -- The run holds a slot (admitted_at: released to it, kairos.budgets), or — a run nobody released,
       -- whose id reached a worker anyway — its owner has a slot to spare (KAIROS_OWNER_CONCURRENCY) and
       -- its concurrency key one too: race-free because kairos_claim_slot_free takes the owner's slot lock
       -- (to this transaction's end, as every release does) before it counts, in a snapshot of its own.
       -- A CASE, so that only a queued run holding no slot calls it (and waits for the lock).
       AND CASE WHEN r.admitted_at IS NOT NULL THEN true
                WHEN r.state <> 'queued' THEN false
                ELSE kairos_claim_slot_free(r.id, r.owner, r.schedule_id, r.concurrency_key, r.concurrency_limit,
                                            %(owner_slots)s::integer) END
    RETURNING r.id, r.occurrence_id, r.schedule_id, r.owner, r.source, r.mode, r.state, r.attempt, r.max_attempts,
              r.fence, r.lease_expires_at, r.heartbeat_at, r.conversation_id, r.source_conversation_id, r.prompt,
              r.payload, r.agent, r.runtime_limit_seconds, r.max_steps, r.last_seq, r.corpus, r.retry_of,
              EXISTS (SELECT 1 FROM schedules l WHERE l.id = r.schedule_id AND l.loop) AS loop,
              CASE WHEN r.state <> 'running' THEN NULL
                   WHEN r.agent ->> 'executor' = 'http' THEN 'http' ELSE 'model' END AS first_step,
              CASE WHEN r.state <> 'running' THEN r.diagnosis ->> 'reason_code' END AS refusal,
              coalesce(r.state = 'running' AND r.conversation_id = %(thread_id)s::uuid, false) AS forked
), thread AS (
    -- The fork run's thread: the source at its latest entry (as conversations_fork), no entry copied.
    INSERT INTO conversations (id, owner, title, agent, parent_id, fork_seq, origin_run_id, created_at)
    SELECT c.conversation_id, s.owner, s.title, s.agent, s.id,
           coalesce((SELECT max(e.seq) FROM conversation_entries e WHERE e.conversation_id = s.id), s.fork_seq, 0),
           c.id, coalesce(%(now)s::timestamptz, now())
      FROM changed c
      JOIN conversations s ON s.id = c.source_conversation_id
     WHERE c.forked
    RETURNING id, fork_seq
), prompted AS (
    -- The run's prompt entry, first in its new thread (the text as kairos.execution.claim._prompt_entry).
    INSERT INTO conversation_entries (conversation_id, seq, role, content, run_id, created_at)
    SELECT f.id, f.fork_seq + 1, 'user',
           CASE WHEN c.payload IS NULL OR c.payload = 'null'::jsonb THEN c.prompt
                ELSE c.prompt || E'\n\n[webhook payload: kept with run ' || c.id::text || ']' END,
           c.id, coalesce(%(now)s::timestamptz, now())
      FROM changed c
     CROSS JOIN thread f
), changed_events AS (
    -- A claim: run.claimed and step.started. A refusal: its one terminal event.
    -- One batch ending at the bumped last_seq (run_events, migration 0034).
    INSERT INTO run_event_batches (run_id, last_seq, at, attempt, fence, events)
    SELECT c.id, c.last_seq, coalesce(%(now)s::timestamptz, now()), c.attempt, c.fence,
           CASE WHEN c.refusal IS NULL
                THEN jsonb_build_array(
                         jsonb_build_object('type', 'run.claimed',
                                            'data', jsonb_build_object('attempt', c.attempt, 'mode', c.mode)),
                         jsonb_build_object('type', 'step.started', 'step', c.first_step,
                                            'data', jsonb_build_object('attempt', c.attempt)))
                ELSE jsonb_build_array(jsonb_build_object(
                         'type', 'run.' || c.state,
                         'data', jsonb_build_object('reason_code', c.refusal, 'by', 'claim'))) END
      FROM changed c
), lineage (id, parent_id, fork_seq, upto, depth) AS (
    -- The window (as conversation_entries_window): the thread's lineage from its source on.
    SELECT s.id, s.parent_id, s.fork_seq, NULL::integer, 0
      FROM changed c
      JOIN conversations s ON s.id = c.source_conversation_id
     WHERE c.forked AND %(window_budget)s::integer IS NOT NULL
    UNION ALL
    SELECT p.id, p.parent_id, p.fork_seq, least(l.upto, l.fork_seq), l.depth + 1
      FROM lineage l
     CROSS JOIN LATERAL (SELECT c.id, c.parent_id, c.fork_seq FROM conversations c WHERE c.id = l.parent_id
                         LIMIT 1) p
     WHERE l.depth < 10000
), newest AS (
    SELECT n.seq, n.role, n.content, n.run_id, n.created_at,
           sum(length(n.content) + %(window_overhead)s::integer) OVER (ORDER BY n.seq DESC) AS used
      FROM (SELECT e.seq, e.role, e.content, e.run_id, e.created_at
              FROM lineage l
             CROSS JOIN LATERAL (
                   SELECT e.seq, e.role, e.content, e.run_id, e.created_at
                     FROM conversation_entries e
                    WHERE e.conversation_id = l.id AND e.seq <= coalesce(l.upto, 2147483647)
                      AND (e.run_id IS NULL OR e.run_id <> %(run_id)s)
                    ORDER BY e.seq DESC
                    LIMIT greatest(%(window_budget)s::integer, 0) / %(window_overhead)s::integer + 1) e
             ORDER BY e.seq DESC
             LIMIT greatest(%(window_budget)s::integer, 0) / %(window_overhead)s::integer + 1) n
), kept AS (
    SELECT seq, role, content, run_id, created_at FROM newest WHERE used <= %(window_budget)s::integer
)
SELECT c.*,
       (SELECT coalesce(sum((SELECT count(*) FROM conversation_entries e
                              WHERE e.conversation_id = l.id AND e.seq <= coalesce(l.upto, 2147483647)
                                AND (e.run_id IS NULL OR e.run_id <> %(run_id)s))), 0)
          FROM lineage l) - (SELECT count(*) FROM kept) AS window_elided,
       (SELECT jsonb_agg(jsonb_build_array(k.seq, k.role, k.content, k.run_id, k.created_at) ORDER BY k.seq)
          FROM kept k) AS window_entries
  FROM changed c;

-- name: runs_release_slots
-- Releases the waiting runs these owners' free slots let in, oldest first (kairos_release_slots, in
-- owner order: one statement takes several owners' slot locks, always in the same order). Run it as
-- the last statement of its transaction (it waits for the locks); returns the runs released.
SELECT r.id
  FROM (SELECT DISTINCT owner FROM unnest(%(owners)s::text[]) AS g (owner) ORDER BY owner) AS o
 CROSS JOIN LATERAL kairos_release_slots(o.owner, NULL, %(now)s::timestamptz) AS r (id);

-- name: runs_owners_of
-- The owners of these runs, each once, in order.
SELECT DISTINCT owner FROM runs WHERE id = ANY(%(ids)s::uuid[]) ORDER BY owner;

-- name: runs_waiting_owners
-- Owners with runs waiting for a slot (runs_slot_waiting_idx), for the tick's release pass. In the
-- index's order (its owner key sorts by "C", migration 0048), so that the LIMIT stops the scan; the
-- release sorts them again to take their locks.
SELECT DISTINCT owner COLLATE "C" AS owner
  FROM runs
 WHERE state = 'queued' AND admitted_at IS NULL AND blocked_by_run_id IS NULL AND paused_at IS NULL
 ORDER BY 1
 LIMIT %(limit)s;

-- name: runs_admitted_sent
-- Of these runs, those queued that hold a slot and were handed to SQS before: a deliberate re-send
-- (a webhook flow's window closing). A run released but not yet sent is its releaser's to send.
SELECT id
  FROM runs
 WHERE id = ANY(%(ids)s::uuid[])
   AND state = 'queued' AND admitted_at IS NOT NULL AND handoff_at IS NOT NULL
   AND blocked_by_run_id IS NULL AND paused_at IS NULL
 ORDER BY created_at, id;

-- name: runs_held_of
-- Of these runs, the queued ones their webhook flow holds (held_until ahead): a timer is sent for each.
SELECT id
  FROM runs
 WHERE id = ANY(%(ids)s::uuid[])
   AND state = 'queued' AND held_until > coalesce(%(now)s::timestamptz, now())
 ORDER BY created_at, id;

-- name: runs_admitted_unsent
-- The runs these runs' ends released (released_by) that hold their slot, are queued and were not
-- handed to SQS since (a held run's timer went before it was released): what the ending worker
-- sends after its commit (runs_released_by_idx).
SELECT id
  FROM runs
 WHERE released_by = ANY(%(ids)s::uuid[])
   AND state = 'queued' AND admitted_at IS NOT NULL AND (handoff_at IS NULL OR handoff_at < admitted_at)
   AND blocked_by_run_id IS NULL AND paused_at IS NULL
 ORDER BY created_at, id;

-- name: runs_get
-- One run by id, whoever owns it (the worker: an SQS message names a run, never an owner).
SELECT * FROM runs WHERE id = %(run_id)s;

-- name: runs_get_owned
-- One run of one owner; another owner's run is as absent as a missing one. loop: its schedule is a
-- goal loop (the API does not offer retry_run on such a run's diagnosis). waiting_for: what a queued
-- run waits for ('slot', 'key'; kairos_waiting_for, migration 0030).
SELECT *, EXISTS (SELECT 1 FROM schedules l WHERE l.id = runs.schedule_id AND l.loop) AS loop,
       kairos_waiting_for(runs) AS waiting_for
  FROM runs WHERE id = %(run_id)s AND owner = %(owner)s;

-- name: runs_list_owned
-- One keyset page of an owner's runs, newest first: (created_at, id) strictly below the cursor
-- (kairos.pages), optionally of one schedule, one conversation (its target thread or the
-- conversation it was scheduled from), one state, one source. Reads runs_owner_created_idx, or
-- runs_schedule_created_idx with a schedule; limit is the page size plus one (is there more?). The
-- other filters are checked on the rows of that range: a page of a rare state or of one conversation
-- among many reads the owner's runs until it is full (no index per filter: each would cost every
-- claim and terminal update one more entry). loop: as runs_get_owned.
SELECT *, EXISTS (SELECT 1 FROM schedules l WHERE l.id = runs.schedule_id AND l.loop) AS loop,
       kairos_waiting_for(runs) AS waiting_for
  FROM runs
 WHERE owner = %(owner)s
   AND (%(schedule_id)s::uuid IS NULL OR schedule_id = %(schedule_id)s::uuid)
   AND (%(conversation_id)s::uuid IS NULL
        OR conversation_id = %(conversation_id)s::uuid OR source_conversation_id = %(conversation_id)s::uuid)
   AND (%(state)s::text IS NULL OR state = %(state)s::text)
   AND (%(source)s::text IS NULL OR source = %(source)s::text)
   AND (%(before_at)s::timestamptz IS NULL
        OR (created_at, id) < (%(before_at)s::timestamptz, %(before_id)s::uuid))
 ORDER BY created_at DESC, id DESC
 LIMIT %(limit)s;

-- name: runs_last_of_schedules
-- The newest run of each of an owner's schedules (none: no row), for a schedule's last_run: one
-- probe of runs_schedule_created_idx per schedule. A test run is never a schedule's last run.
SELECT s.schedule_id, r.id, r.state, r.source, r.created_at, r.finished_at
  FROM unnest(%(schedule_ids)s::uuid[]) AS s (schedule_id)
 CROSS JOIN LATERAL (SELECT id, state, source, created_at, finished_at
                       FROM runs
                      WHERE schedule_id = s.schedule_id AND owner = %(owner)s AND NOT test
                      ORDER BY created_at DESC, id DESC
                      LIMIT 1) AS r;

-- name: runs_lock_owned
-- One run of one owner, locked for a state change decided by the caller (cancel). loop: as runs_get_owned.
SELECT *, EXISTS (SELECT 1 FROM schedules l WHERE l.id = runs.schedule_id AND l.loop) AS loop FROM runs WHERE id = %(run_id)s AND owner = %(owner)s FOR NO KEY UPDATE;

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
-- running -> succeeded with its output reference; never after a cancel request, and never while the
-- effect it names (`effect_id`, the answer's call, settled earlier in the same transaction) is still
-- reserved. Here, as in every move out of `running`, usage is the sum of the run's settled effects
-- (kairos_run_usage, migration 0022): every attempt's calls, the one settled just before included.
UPDATE runs
   SET last_seq = last_seq + jsonb_array_length(%(events)s::jsonb),
       state = 'succeeded',
       output = %(output)s,
       usage = coalesce(kairos_run_usage(id), usage),
       lease_token = NULL,
       lease_expires_at = NULL,
       finished_at = coalesce(%(now)s::timestamptz, now()),
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = %(run_id)s AND fence = %(fence)s AND state = 'running' AND cancel_requested_at IS NULL
   AND (%(effect_id)s::uuid IS NULL
        OR NOT EXISTS (SELECT 1 FROM effects e WHERE e.id = %(effect_id)s::uuid AND e.state = 'reserved'))
RETURNING id, last_seq, attempt, fence;

-- name: runs_publish (prepared)
-- The run's answer published and the run ended succeeded, in one statement: the answer entry (as
-- conversation_entries_append_fenced, only while no cancel is requested), the answer's effect settled
-- with its usage (as effects_close; its budget settlement is the deferred trigger on effects), the
-- terminal update (as runs_succeed, its usage counting that effect: kairos_run_usage_with) and its four
-- events (effect.settled, output.published, step.finished, run.succeeded) as one batch. Each part writes
-- only behind the one before it, so it is all or nothing; zero rows: the fence moved on, or a cancel was
-- requested (nothing written). The worker sends it behind the run's and the conversation's lock
-- (conversations_lock_fenced), a statement of its own, so that this one's snapshot — the answer's seq —
-- is taken after that lock.
WITH answer AS (
    INSERT INTO conversation_entries (conversation_id, seq, role, content, run_id, created_at)
    SELECT c.id,
           coalesce((SELECT max(e.seq) FROM conversation_entries e WHERE e.conversation_id = c.id), c.fork_seq, 0) + 1,
           'assistant', %(content)s, %(run_id)s, coalesce(%(now)s::timestamptz, now())
      FROM conversations c
     WHERE c.id = %(conversation_id)s
       AND EXISTS (SELECT 1 FROM runs r
                    WHERE r.id = %(run_id)s AND r.fence = %(fence)s AND r.state = 'running'
                      AND r.conversation_id = c.id AND r.cancel_requested_at IS NULL)
    RETURNING seq
), closed AS (
    UPDATE effects e
       SET state = 'settled',
           usage = %(usage)s,
           error_code = NULL,
           settled_at = coalesce(%(now)s::timestamptz, now())
      FROM answer
     WHERE e.id = %(effect_id)s AND e.run_id = %(run_id)s AND e.fence = %(fence)s AND e.state = 'reserved'
    RETURNING e.id, e.step
), changed AS (
    UPDATE runs r
       SET last_seq = r.last_seq + 4,
           state = 'succeeded',
           output = jsonb_build_object('conversation_id', %(conversation_id)s::text, 'entry_seq', a.seq,
                                       'attempt', r.attempt),
           usage = coalesce(kairos_run_usage_with(r.id, c.id, %(usage)s::jsonb), r.usage),
           lease_token = NULL,
           lease_expires_at = NULL,
           finished_at = coalesce(%(now)s::timestamptz, now()),
           updated_at = coalesce(%(now)s::timestamptz, now())
      FROM answer a CROSS JOIN closed c
     WHERE r.id = %(run_id)s AND r.fence = %(fence)s AND r.state = 'running' AND r.cancel_requested_at IS NULL
    RETURNING r.id, r.last_seq, r.attempt, r.fence, a.seq, c.step AS effect_step
), appended AS (
    INSERT INTO run_event_batches (run_id, last_seq, at, attempt, fence, events)
    SELECT ch.id, ch.last_seq, coalesce(%(now)s::timestamptz, now()), ch.attempt, ch.fence,
           jsonb_build_array(
               jsonb_build_object('type', 'effect.settled', 'step', ch.effect_step,
                                  'data', jsonb_build_object('effect_id', %(effect_id)s::text, 'state', 'settled')),
               jsonb_build_object('type', 'output.published', 'step', %(step)s::text,
                                  'data', jsonb_build_object('conversation_id', %(conversation_id)s::text,
                                                             'entry_seq', ch.seq, 'truncated', %(truncated)s::boolean)),
               jsonb_build_object('type', 'step.finished', 'step', %(step)s::text,
                                  'data', jsonb_build_object('outcome', 'succeeded')),
               jsonb_build_object('type', 'run.succeeded', 'step', NULL::text,
                                  'data', jsonb_build_object('entry_seq', ch.seq)))
      FROM changed ch
)
SELECT seq FROM changed;

-- name: runs_fail (prepared)
-- running -> failed with a closed diagnosis, by the fence holder.
UPDATE runs
   SET last_seq = last_seq + jsonb_array_length(%(events)s::jsonb),
       state = 'failed',
       diagnosis = %(diagnosis)s,
       usage = coalesce(kairos_run_usage(id), usage),
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
       usage = coalesce(kairos_run_usage(id), usage),
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
       usage = coalesce(kairos_run_usage(id), usage),
       lease_token = NULL,
       lease_expires_at = NULL,
       handoff_at = coalesce(%(now)s::timestamptz, now()),
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE r.id = %(run_id)s AND r.fence = %(fence)s AND r.state = 'running'
   AND r.cancel_requested_at IS NULL
   AND r.attempt < r.max_attempts
   AND NOT EXISTS (SELECT 1 FROM effects e WHERE e.run_id = r.id AND e.mutation
                                            AND e.state NOT IN ('failed', 'not_sent_test'))
RETURNING id, last_seq, attempt, fence;

-- name: runs_cancel_waiting
-- queued (or awaiting approval or input) -> cancelled at once: no worker holds the run.
UPDATE runs
   SET last_seq = last_seq + jsonb_array_length(%(events)s::jsonb),
       state = 'cancelled',
       cancel_requested_at = coalesce(cancel_requested_at, coalesce(%(now)s::timestamptz, now())),
       diagnosis = %(diagnosis)s,
       finished_at = coalesce(%(now)s::timestamptz, now()),
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = %(run_id)s AND state IN ('queued', 'awaiting_approval', 'awaiting_input')
   AND (%(owner)s::text IS NULL OR owner = %(owner)s::text)
   AND (NOT %(requested_only)s::boolean OR cancel_requested_at IS NOT NULL)
RETURNING *, EXISTS (SELECT 1 FROM schedules l WHERE l.id = runs.schedule_id AND l.loop) AS loop;

-- name: runs_request_cancel
-- Marks a running run for cancellation; its worker ends it at the next heartbeat or step.
UPDATE runs
   SET last_seq = last_seq + jsonb_array_length(%(events)s::jsonb),
       cancel_requested_at = coalesce(%(now)s::timestamptz, now()),
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = %(run_id)s AND owner = %(owner)s AND state = 'running' AND cancel_requested_at IS NULL
RETURNING *, EXISTS (SELECT 1 FROM schedules l WHERE l.id = runs.schedule_id AND l.loop) AS loop;

-- name: runs_stamp_handoff
-- Records that SQS accepted these run ids (any state: a fast worker may have claimed one already).
-- unclaimed_handoffs counts the sends since the last claim (the claim resets it); a send a fast
-- worker claimed before this stamp does not count.
UPDATE runs
   SET handoff_at = coalesce(%(now)s::timestamptz, now()),
       handoff_count = handoff_count + 1,
       unclaimed_handoffs = unclaimed_handoffs + CASE WHEN state = 'queued' THEN 1 ELSE 0 END
 WHERE id = ANY(%(ids)s::uuid[]);

-- name: runs_lock_unsettled
-- The ended, unsettled runs of schedules the caller holds locked, in finished order per schedule.
SELECT id, schedule_id, state, finished_at, diagnosis ->> 'reason_code' AS reason_code, test
  FROM runs
 WHERE schedule_id = ANY(%(schedule_ids)s::uuid[])
   AND finished_at IS NOT NULL AND settled_at IS NULL
 ORDER BY schedule_id, finished_at, id
   FOR NO KEY UPDATE;

-- name: runs_settle_unscheduled
-- Marks ended runs of no schedule (chat turns) settled, a bounded batch, skipping held rows.
UPDATE runs
   SET settled_at = coalesce(%(now)s::timestamptz, now())
 WHERE id IN (SELECT id FROM runs
               WHERE schedule_id IS NULL AND finished_at IS NOT NULL AND settled_at IS NULL
               LIMIT %(limit)s
                 FOR NO KEY UPDATE SKIP LOCKED)
RETURNING id;

-- name: runs_mark_settled
-- Marks ended runs as accounted for; each run is settled once.
UPDATE runs
   SET settled_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = ANY(%(ids)s::uuid[]) AND finished_at IS NOT NULL AND settled_at IS NULL
RETURNING id;

-- name: runs_lock_past_retention
-- Locks (skipping held ones) up to `limit` settled runs that ended more than `retention_days` ago and
-- are not pruned yet, oldest end first, each with its own thread: the fork or fresh conversation the
-- run created (NULL for an append run, or before the run made one).
SELECT r.id, c.id AS thread_id
  FROM runs r
  LEFT JOIN conversations c
    ON c.id = r.conversation_id AND c.origin_run_id = r.id AND r.mode IN ('fork', 'fresh')
 WHERE r.pruned_at IS NULL AND r.finished_at IS NOT NULL AND r.settled_at IS NOT NULL
   AND r.finished_at <= coalesce(%(now)s::timestamptz, now()) - make_interval(days => %(retention_days)s::integer)
 ORDER BY r.finished_at
 LIMIT %(limit)s
   FOR NO KEY UPDATE OF r SKIP LOCKED;

-- name: runs_mark_pruned
-- Records that retention passed over runs the caller holds locked and clears their webhook payload;
-- says of each whether it carried one. State, output reference, usage and diagnosis stay.
WITH old AS (
    SELECT id, payload IS NOT NULL AS had_payload
      FROM runs
     WHERE id = ANY(%(ids)s::uuid[]) AND pruned_at IS NULL AND finished_at IS NOT NULL
)
UPDATE runs r
   SET payload = NULL,
       pruned_at = coalesce(%(now)s::timestamptz, now())
  FROM old
 WHERE r.id = old.id
RETURNING r.id, old.had_payload;

-- name: runs_forget_content
-- Forgets what runs past retention (the caller holds them locked, and has called
-- kairos_allow_pruning(): corpus rows are append-only) said or were told outside their thread: their
-- steps' previews and fold records (the model's turns, the tools' arguments and answers) are cleared
-- and the steps stamped pruned_at (kind, name, state, times, target, usage stay); their corpus outputs
-- and records are deleted; their approvals' argument previews and their input requests' questions
-- become a marker.
-- Their settled budget reservations (a model call's effect's charge_*: the daily ledger's working
-- state, needed only until the call settles) are cleared too; the ledger's totals stay. Ids, states, digests, counts and
-- export handles stay. Says how much of each it forgot.
WITH steps AS (
    UPDATE run_steps
       SET record = NULL, input = NULL, output = NULL, pruned_at = coalesce(%(now)s::timestamptz, now())
     WHERE run_id = ANY(%(ids)s::uuid[]) AND pruned_at IS NULL
    RETURNING 1
), reservations AS (
    UPDATE effects
       SET charge_day = NULL, charge_tokens = NULL, charge_cost_usd = NULL, charge_stripe = NULL
     WHERE run_id = ANY(%(ids)s::uuid[]) AND charge_day IS NOT NULL AND state <> 'reserved'
    RETURNING 1
), outputs AS (
    DELETE FROM corpus_outputs WHERE run_id = ANY(%(ids)s::uuid[]) RETURNING 1
), records AS (
    DELETE FROM corpus_records WHERE run_id = ANY(%(ids)s::uuid[]) RETURNING 1
), previews AS (
    UPDATE approvals
       SET preview = jsonb_build_object('tool', tool, 'pruned', true),
           updated_at = coalesce(%(now)s::timestamptz, now())
     WHERE run_id = ANY(%(ids)s::uuid[]) AND preview <> jsonb_build_object('tool', tool, 'pruned', true)
    RETURNING 1
), questions AS (
    UPDATE input_requests
       SET question = %(forgotten)s,
           updated_at = coalesce(%(now)s::timestamptz, now())
     WHERE run_id = ANY(%(ids)s::uuid[]) AND question <> %(forgotten)s
    RETURNING 1
)
SELECT (SELECT count(*) FROM steps)::integer AS steps,
       (SELECT count(*) FROM outputs)::integer + (SELECT count(*) FROM records)::integer AS corpus_rows,
       (SELECT count(*) FROM previews)::integer AS previews,
       (SELECT count(*) FROM questions)::integer AS questions,
       (SELECT count(*) FROM reservations)::integer AS reservations;

-- name: runs_release_blocked
-- queue_one: unblocks queued runs whose blocker has ended, so they can be handed to SQS. A scheduled
-- run without catch-up becomes claimable here, so its expiry is set here: its occurrence's dispatch_at
-- (fire_at plus its jitter offset) + max_delay_seconds (a run that waited behind a long blocker is not
-- delivered late either).
UPDATE runs AS r
   SET blocked_by_run_id = NULL,
       expires_at = CASE WHEN r.source = 'scheduled' AND NOT r.catch_up
                         THEN coalesce(o.dispatch_at, o.fire_at) + make_interval(secs => (SELECT s.max_delay_seconds FROM schedules s
                                                                  WHERE s.id = r.schedule_id)) END,
       updated_at = coalesce(%(now)s::timestamptz, now())
  FROM occurrences o
 WHERE r.id IN (SELECT w.id
                  FROM runs w
                  JOIN runs b ON b.id = w.blocked_by_run_id
                 WHERE w.state = 'queued' AND w.blocked_by_run_id IS NOT NULL AND b.finished_at IS NOT NULL
                 LIMIT %(limit)s
                   FOR NO KEY UPDATE OF w SKIP LOCKED)
   AND r.state = 'queued'
   AND o.id = r.occurrence_id
RETURNING r.id;

-- name: runs_lock_unsent
-- Locks queued, unblocked runs holding a slot whose handoff never happened (and whose release is not
-- fresh: its releaser is about to send it) or is stale, or whose hold ended with no message since (a
-- lost window timer), never-sent first. It reads every queued, unblocked run from runs_handoff_idx and checks its handoff on the row:
-- the index names no column the handoff stamp writes, so each stamp is a HOT update (migration 0019);
-- the owners' queue caps bound what this reads, once a tick.
SELECT id, owner, unclaimed_handoffs
  FROM runs
 WHERE state = 'queued'
   AND blocked_by_run_id IS NULL
   AND max_attempts >= 1  -- true of every row; lets runs_handoff_idx serve this (migrations 0017, 0019)
   AND paused_at IS NULL  -- a paused corpus run is sent again by its resume
   AND admitted_at IS NOT NULL  -- a run waiting for a slot is released, never sent (kairos.budgets)
   AND ((handoff_at IS NULL
         AND admitted_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(fresh_seconds)s))
        OR handoff_at < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(stale_seconds)s)
        -- A held run (kairos.flow) due for longer than `fresh` with no message sent since it became
        -- due: its timer was lost. The window is closed here, as a lost handoff is repaired.
        OR (held_until < coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(fresh_seconds)s)
            AND handoff_at < held_until))
 ORDER BY handoff_at NULLS FIRST, created_at
 LIMIT %(limit)s
   FOR NO KEY UPDATE SKIP LOCKED;

-- name: runs_fail_undeliverable
-- queued -> failed (undeliverable): a run the caller holds locked that SQS accepted that many times
-- since its last claim with no worker claiming it; a failure like any other for the settle step.
UPDATE runs
   SET last_seq = last_seq + jsonb_array_length(%(events)s::jsonb),
       state = 'failed',
       diagnosis = %(diagnosis)s,
       finished_at = coalesce(%(now)s::timestamptz, now()),
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = %(id)s AND state = 'queued' AND unclaimed_handoffs >= %(handoffs)s
RETURNING id, last_seq, attempt, fence, schedule_id, unclaimed_handoffs;

-- name: runs_lock_expired
-- Locks running runs whose lease expired (their worker is presumed gone) for the rescue. Reads the slot
-- holders (runs_slot_holders_idx: the running runs and the queued runs holding a slot, migration 0043).
SELECT id, schedule_id, owner, source, catch_up, restarts, fence, attempt, cancel_requested_at,
       corpus IS NOT NULL AS corpus_run  -- a corpus run resumes what it committed: never abandoned late
  FROM runs
 WHERE state = 'running'
   AND lease_expires_at < coalesce(%(now)s::timestamptz, now())
 ORDER BY lease_expires_at
 LIMIT %(limit)s
   FOR NO KEY UPDATE SKIP LOCKED;

-- name: runs_requeue_rescued
-- running -> queued after an expired lease: restarts + 1, lease cleared, handoff to be redone;
-- run.rescued follows in the same statement (kairos.trace.change). It keeps its running slot
-- (admitted_at, kairos.budgets): the repair sends it at once.
UPDATE runs
   SET last_seq = last_seq + jsonb_array_length(%(events)s::jsonb),
       state = 'queued',
       usage = coalesce(kairos_run_usage(id), usage),
       lease_token = NULL,
       lease_expires_at = NULL,
       restarts = restarts + 1,
       admitted_at = coalesce(admitted_at, coalesce(%(now)s::timestamptz, now())),
       handoff_at = NULL,
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = %(id)s AND state = 'running' AND fence = %(fence)s
   AND lease_expires_at < coalesce(%(now)s::timestamptz, now())
RETURNING id, last_seq, attempt, fence, restarts;

-- name: runs_end_rescued
-- running -> abandoned, failed or cancelled after an expired lease, with its diagnosis; run.<state>
-- follows in the same statement (kairos.trace.change).
UPDATE runs
   SET last_seq = last_seq + jsonb_array_length(%(events)s::jsonb),
       state = %(state)s,
       usage = coalesce(kairos_run_usage(id), usage),
       diagnosis = %(diagnosis)s,
       lease_token = NULL,
       lease_expires_at = NULL,
       finished_at = coalesce(%(now)s::timestamptz, now()),
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = %(id)s AND state = 'running' AND fence = %(fence)s
   AND lease_expires_at < coalesce(%(now)s::timestamptz, now())
RETURNING id, last_seq, attempt, fence;

-- name: runs_ops_list
-- Operators: the newest runs, optionally of one schedule or in one state.
SELECT *, EXISTS (SELECT 1 FROM schedules l WHERE l.id = runs.schedule_id AND l.loop) AS loop,
       kairos_waiting_for(runs) AS waiting_for
  FROM runs
 WHERE (%(schedule_id)s::uuid IS NULL OR schedule_id = %(schedule_id)s)
   AND (%(state)s::text IS NULL OR state = %(state)s)
 ORDER BY created_at DESC, id
 LIMIT %(limit)s;

-- name: runs_ops_get
-- Operators: one run whoever owns it.
SELECT *, EXISTS (SELECT 1 FROM schedules l WHERE l.id = runs.schedule_id AND l.loop) AS loop,
       kairos_waiting_for(runs) AS waiting_for
  FROM runs WHERE id = %(id)s;

-- name: runs_ops_events
-- Operators: a run's whole trace in order (progress included).
SELECT seq, type, at, attempt, fence, step, data FROM run_events WHERE run_id = %(id)s ORDER BY seq;

-- name: runs_ops_status
-- Operators: queued and running counts, the oldest queued run, runs whose lease expired, and queued
-- runs whose handoff never happened or is stale (the tick's repair picks both up). The queued runs
-- are read from runs_owner_active_idx, the running ones from runs_slot_holders_idx (migration 0043).
-- The index serves only a query whose conditions imply its predicate, `owner IS NOT NULL` included
-- (that conjunct keeps the claim off it, 0017). `owner <> ''` is true of every row (its domain's
-- check, kairos_owner_check) and, a strict comparison, implies it. Stating `owner IS NOT NULL` itself
-- does not serve on PostgreSQL 17 and later, which drop an IS NOT NULL condition on a NOT NULL column
-- before they match indexes.
SELECT q.queued, r.running, q.oldest_queued_at, r.lease_expired, q.handoff_pending
  FROM (SELECT count(*) AS queued,
               min(created_at) AS oldest_queued_at,
               count(*) FILTER (WHERE blocked_by_run_id IS NULL AND (handoff_at IS NULL
                   OR handoff_at < coalesce(%(now)s::timestamptz, now()) - interval '15 minutes')) AS handoff_pending
          FROM runs
         WHERE state = 'queued'
           AND owner <> '') AS q  -- true of every row; lets runs_owner_active_idx serve this
 CROSS JOIN (SELECT count(*) AS running,
                    count(*) FILTER (WHERE lease_expires_at < coalesce(%(now)s::timestamptz, now())) AS lease_expired
               FROM runs
              WHERE state = 'running') AS r;

-- name: runs_overlap_of_schedule
-- What overlap sees of a schedule outside the tick (trigger, retry): its newest active run and a
-- queued-behind run already waiting. Test runs stand in no one's way. The active runs are read as the
-- tick's schedules_lock_due reads them: the running ones among the owner's slot holders.
SELECT (SELECT a.id
          FROM ((SELECT r.id, r.created_at FROM runs r
                  WHERE r.schedule_id = %(schedule_id)s AND NOT r.test
                    AND r.state IN ('queued', 'awaiting_approval', 'awaiting_input')
                 OFFSET 0)
                UNION ALL
                (SELECT h.id, h.created_at FROM runs h
                  WHERE h.owner = (SELECT s.owner FROM schedules s WHERE s.id = %(schedule_id)s)
                    AND h.state = 'running' AND h.schedule_id = %(schedule_id)s AND NOT h.test
                 OFFSET 0)) AS a
         ORDER BY a.created_at DESC, a.id DESC
         LIMIT 1) AS active_run_id,
       (SELECT r.id FROM runs r
         WHERE r.schedule_id = %(schedule_id)s AND r.state = 'queued' AND r.blocked_by_run_id IS NOT NULL
         LIMIT 1) AS waiting_run_id;

-- name: runs_lock_holding
-- Of these runs, those that hold a slot (running, or queued with admitted_at), locked in id order: the
-- runs a tick's cancel_replace may cancel, locked before the fire takes its owners' slot locks (a
-- statement ending such a run holds its row, then its trigger takes the owner's slot lock).
SELECT id
  FROM runs
 WHERE id = ANY(%(ids)s::uuid[]) AND (state = 'running' OR admitted_at IS NOT NULL)
 ORDER BY id
   FOR NO KEY UPDATE;

-- name: runs_lock_any
-- One run whoever owns it, locked: cancel_replace holds the run it replaces while it decides, so the
-- run's worker cannot reserve an effect in between (effects_reserve updates this row).
SELECT * FROM runs WHERE id = %(run_id)s FOR NO KEY UPDATE;

-- name: runs_block_not_replace_safe
-- queued -> policy_blocked at once: the new run of a cancel_replace fire whose predecessor had
-- already reserved an external change (not replace-safe).
UPDATE runs
   SET last_seq = last_seq + jsonb_array_length(%(events)s::jsonb),
       state = 'policy_blocked',
       diagnosis = %(diagnosis)s,
       finished_at = coalesce(%(now)s::timestamptz, now()),
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = %(run_id)s AND state = 'queued'
RETURNING *;

-- name: runs_last_backfill
-- The last link of a schedule's unfinished backfill chain (the latest request's newest instant): the
-- next backfill run waits for it.
SELECT r.id FROM runs r JOIN occurrences o ON o.id = r.occurrence_id
 WHERE r.schedule_id = %(schedule_id)s AND r.source = 'backfill' AND r.finished_at IS NULL
 ORDER BY r.created_at DESC, o.fire_at DESC
 LIMIT 1;

-- name: runs_last_chat_turn
-- The newest chat turn of a conversation that has not ended: the next turn waits for it, so a
-- conversation's turns run one at a time, in the order they were posted.
SELECT id FROM runs
 WHERE source_conversation_id = %(conversation_id)s AND source = 'chat' AND finished_at IS NULL
 ORDER BY created_at DESC, id DESC
 LIMIT 1;

-- name: runs_step_events
-- Appends a tool loop's step events for the fence holder (the step's effect is settled and the step
-- recorded in the same transaction).
UPDATE runs
   SET last_seq = last_seq + jsonb_array_length(%(events)s::jsonb),
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = %(run_id)s AND fence = %(fence)s AND state = 'running'
RETURNING id, last_seq, attempt, fence;

-- name: runs_await_approval
-- running -> awaiting_approval for the fence holder: the lease is cleared (no worker holds the run,
-- the owner's slot is free) until a person decides.
UPDATE runs
   SET last_seq = last_seq + jsonb_array_length(%(events)s::jsonb),
       state = 'awaiting_approval',
       usage = coalesce(kairos_run_usage(id), usage),
       lease_token = NULL,
       lease_expires_at = NULL,
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = %(run_id)s AND fence = %(fence)s AND state = 'running' AND cancel_requested_at IS NULL
RETURNING id, last_seq, attempt, fence;

-- name: runs_requeue_approved
-- awaiting_approval -> queued once its request is approved: a new attempt applies the approved call.
-- The run started on time; its delivery deadline (expires_at) is dropped, or a run its owner took an
-- hour to approve would be refused `expired` at the claim the approval asked for.
UPDATE runs
   SET last_seq = last_seq + jsonb_array_length(%(events)s::jsonb),
       state = 'queued',
       expires_at = NULL,
       handoff_at = NULL,
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = %(run_id)s AND state = 'awaiting_approval'
RETURNING id, last_seq, attempt, fence;

-- name: runs_block_approval
-- awaiting_approval -> policy_blocked: its request was denied or expired.
UPDATE runs
   SET last_seq = last_seq + jsonb_array_length(%(events)s::jsonb),
       state = 'policy_blocked',
       diagnosis = %(diagnosis)s,
       finished_at = coalesce(%(now)s::timestamptz, now()),
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = %(run_id)s AND state = 'awaiting_approval'
RETURNING id, last_seq, attempt, fence;

-- name: runs_corpus_lock
-- The partition boundary: locks the running run while the caller's fence holds; reports a cancel
-- and a pause request, and the usage earlier invocations of the run recorded.
SELECT id, fence, attempt, owner, cancel_requested_at, pause_requested_at, usage
  FROM runs
 WHERE id = %(run_id)s AND fence = %(fence)s AND state = 'running'
   FOR NO KEY UPDATE;

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
       usage = coalesce(kairos_run_usage(id), usage),
       handoff_at = coalesce(%(now)s::timestamptz, now()),
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = %(run_id)s AND fence = %(fence)s AND state = 'running'
   AND pause_requested_at IS NOT NULL AND cancel_requested_at IS NULL
RETURNING id, last_seq, attempt, fence;

-- name: runs_corpus_continue
-- running -> queued at a partition boundary when the invocation's time is nearly spent, by the fence
-- holder (a pause or cancel request is handled by its own move instead): the lease cleared, the usage
-- so far recorded, no expiry (the run started on time; as a pause, and as the rescue's requeue of a
-- corpus run), handoff_at = now — the worker re-sends the id at once, and should that send fail the
-- tick's repair sends it once the handoff is stale. Not a retry: it needs no attempt left, and the
-- next claim resumes what this one committed. run.queued follows in the same statement.
UPDATE runs
   SET last_seq = last_seq + jsonb_array_length(%(events)s::jsonb),
       state = 'queued',
       lease_token = NULL,
       lease_expires_at = NULL,
       expires_at = NULL,
       usage = coalesce(kairos_run_usage(id), usage),
       handoff_at = coalesce(%(now)s::timestamptz, now()),
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = %(run_id)s AND fence = %(fence)s AND state = 'running' AND corpus IS NOT NULL
   AND pause_requested_at IS NULL AND cancel_requested_at IS NULL
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

-- name: runs_await_input
-- running -> awaiting_input for the fence holder (a loop run's goal_report: needs_input): the lease is
-- cleared (no worker holds the run, the owner's slot is free) until its owner answers.
UPDATE runs
   SET last_seq = last_seq + jsonb_array_length(%(events)s::jsonb),
       state = 'awaiting_input',
       usage = coalesce(kairos_run_usage(id), usage),
       lease_token = NULL,
       lease_expires_at = NULL,
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = %(run_id)s AND fence = %(fence)s AND state = 'running' AND cancel_requested_at IS NULL
RETURNING id, last_seq, attempt, fence;

-- name: runs_requeue_answered
-- awaiting_input -> queued once its owner answered: a new attempt reads the answer. Waiting for a
-- person is not lateness: the expiry is lifted (it was claimed in time).
UPDATE runs
   SET last_seq = last_seq + jsonb_array_length(%(events)s::jsonb),
       state = 'queued',
       expires_at = NULL,
       handoff_at = NULL,
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = %(run_id)s AND state = 'awaiting_input'
RETURNING id, last_seq, attempt, fence;

-- name: runs_owner_status
-- The console's operator status (GET /v1/status): one owner's queued, running and waiting runs. The
-- running ones are read from the owner's slot holders (runs_slot_holders_idx), the others from
-- runs_owner_active_idx, which holds no running run (migration 0043).
SELECT count(*) FILTER (WHERE state = 'queued') AS queued,
       (SELECT count(*) FROM runs h WHERE h.owner = %(owner)s AND h.state = 'running') AS running,
       count(*) FILTER (WHERE state = 'awaiting_approval') AS awaiting_approval,
       count(*) FILTER (WHERE state = 'awaiting_input') AS awaiting_input,
       min(created_at) FILTER (WHERE state = 'queued') AS oldest_queued_at
  FROM runs
 WHERE owner = %(owner)s AND state IN ('queued', 'awaiting_approval', 'awaiting_input');

-- name: runs_fold_into_window
-- A webhook delivery folds into its schedule's open window (kairos.flow): the newest queued run of the
-- schedule collecting deliveries of this kind whose held_until is still ahead (a batch: with room
-- left), locked by this statement. Debounce keeps the last payload and closes debounce_seconds after
-- it, never past window_deadline (nor earlier than it was held); a batch appends the payload and
-- closes now once it holds max_events. The caller holds the schedule's row lock; a claim that took the
-- run first leaves nothing to fold (the guard below), and the delivery opens a new window.
UPDATE runs AS r
   SET payload = CASE WHEN r.flow_window = 'batch' THEN r.payload || jsonb_build_array(%(payload)s::jsonb)
                      ELSE %(payload)s::jsonb END,
       deliveries = r.deliveries + 1,
       held_until = CASE WHEN r.flow_window = 'batch' AND r.deliveries + 1 >= %(max_events)s
                         THEN coalesce(%(now)s::timestamptz, now())
                         WHEN r.flow_window = 'batch' THEN r.held_until
                         ELSE greatest(r.held_until,
                                       least(coalesce(%(now)s::timestamptz, now())
                                             + make_interval(secs => %(debounce_seconds)s), r.window_deadline))
                    END,
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE r.id = (SELECT w.id
                 FROM runs w
                WHERE w.schedule_id = %(schedule_id)s AND w.state = 'queued' AND w.flow_window = %(window)s
                  AND w.held_until > coalesce(%(now)s::timestamptz, now())
                  AND (w.flow_window <> 'batch' OR w.deliveries < %(max_events)s)
                ORDER BY w.created_at DESC
                LIMIT 1
                  FOR NO KEY UPDATE)
   AND r.state = 'queued'
   AND r.held_until > coalesce(%(now)s::timestamptz, now())
RETURNING r.id, r.held_until, r.deliveries,
          r.held_until <= coalesce(%(now)s::timestamptz, now()) AS closed;

-- name: runs_hold
-- Holds a webhook run its intake just recorded (kairos.flow): not claimed nor handed to SQS before
-- held_until; a window's run also gets its kind, its latest close and its first delivery counted.
UPDATE runs
   SET held_until = %(held_until)s,
       flow_window = %(window)s::text,
       window_deadline = %(deadline)s,
       deliveries = CASE WHEN %(window)s::text IS NULL THEN NULL ELSE 1 END,
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = %(run_id)s AND state = 'queued'
RETURNING id, held_until;

-- name: runs_hook_rate_window
-- The instant the n-th newest run of a webhook schedule became (or becomes) dispatchable
-- (coalesce(held_until, created_at)), among those within the last 60 s or ahead (held); no row: under
-- the hook's rate (kairos.flow.rate_hold). Held runs are read from runs_hook_dispatch_idx, the others
-- from runs_schedule_created_idx (migration 0046: a claim and an end enter no hook index), each branch
-- newest first and no further than the n-th.
SELECT at
  FROM ((SELECT held_until AS at
           FROM runs
          WHERE schedule_id = %(schedule_id)s AND source = 'webhook' AND held_until IS NOT NULL
            AND held_until > coalesce(%(now)s::timestamptz, now()) - interval '60 seconds'
          ORDER BY held_until DESC
          LIMIT %(offset)s + 1)
        UNION ALL
        (SELECT created_at
           FROM runs
          WHERE schedule_id = %(schedule_id)s AND source = 'webhook' AND held_until IS NULL
            AND created_at > coalesce(%(now)s::timestamptz, now()) - interval '60 seconds'
          ORDER BY created_at DESC
          LIMIT %(offset)s + 1)) AS dispatchable
 ORDER BY at DESC
OFFSET %(offset)s
 LIMIT 1;

-- name: runs_held_wait
-- A claim found the run held (its window still open, or deferred by its hook's rate): it stays queued
-- and its message comes back when it is due. That message was delivered, so it is not an unclaimed
-- handoff (the repair must not give the run up as undeliverable). Answers the seconds left.
UPDATE runs
   SET unclaimed_handoffs = 0
 WHERE id = %(run_id)s AND state = 'queued' AND held_until > coalesce(%(now)s::timestamptz, now())
RETURNING id, extract(epoch FROM held_until - coalesce(%(now)s::timestamptz, now()))::float8 AS seconds_left;

-- name: runs_mark_resumed
-- A retry from the last step: the new, unclaimed run records the last of the old run's steps it took over.
UPDATE runs
   SET resumed_from = %(steps)s
 WHERE id = %(run_id)s AND state = 'queued' AND attempt = 0 AND resumed_from IS NULL
RETURNING id;
