-- schedules: definitions and their guarded state moves (API, tick, webhook token rotation). Every
-- edit by the API is one guarded UPDATE that bumps revision and updated_at; zero rows tells the
-- caller the schedule is missing, foreign, or in a state that does not allow the move. The tick's
-- and the webhook intake's locks are FOR NO KEY UPDATE (what an UPDATE of non-key columns takes), so
-- foreign-key checks of concurrent inserts (FOR KEY SHARE) never wait on them; every webhook of one
-- schedule takes the schedule row lock first, so the rate window and the receipt check see every
-- earlier delivery. "Now" is always coalesce(%(now)s, now()): the database clock decides, tests
-- inject it. The schedules_ops_* reads serve operators. State moves: kairos.states.SCHEDULE_MOVES.

-- name: schedules_due_backlog
-- The database clock and the number of active schedules due, for the tick's opening log line.
SELECT coalesce(%(now)s::timestamptz, now()) AS now,
       count(*) AS due
  FROM schedules
 WHERE status = 'active' AND next_dispatch_at <= coalesce(%(now)s::timestamptz, now());

-- name: schedules_lock_due
-- Locks a batch of due schedules (oldest cursor first, skipping held ones) with their newest active run
-- (a test run is not one),
-- in (next_dispatch_at, id) order after the keyset cursor (after_at, after_id): '-infinity' for a full
-- scan. Due means the cursor's dispatch instant (next_fire_at plus its jitter offset) has come.
-- With parts > 1, only the schedules of owners in part ``part`` (the owner's hash modulo parts): the
-- tick's fire workers each take their own owners, so their batches never wait on each other's owner
-- locks. A filter on the heap row, written as a call of int8eq rather than with '=': the planner
-- takes a third of the rows to pass a boolean function it knows nothing of, where it would take one
-- in two hundred to pass an equality on an expression without statistics — and would then read every
-- due row and sort them instead of walking the due index in order up to the limit.
SELECT s.id, s.kind, s.cron, s.interval_seconds, s.starts_at, s.ends_at, s.timezone, s.dst_gap, s.dst_fold,
       s.catch_up, s.overlap, s.revision, s.next_fire_at, s.next_dispatch_at, s.jitter_seconds, s.fire_count,
       s.max_occurrences, s.conversation_id,
       coalesce(%(now)s::timestamptz, now()) AS db_now,
       CASE WHEN s.overlap <> 'allow' THEN (
           -- Its queued and waiting runs (runs_schedule_active_idx) and its running ones, among its owner's
           -- slot holders (runs_slot_holders_idx, a few entries; no schedule index holds running runs,
           -- migration 0045). Each read whole (OFFSET 0), never as a walk of the schedule's history in order.
           SELECT a.id
             FROM ((SELECT r.id, r.created_at FROM runs r
                     WHERE r.schedule_id = s.id AND r.state IN ('queued', 'awaiting_approval', 'awaiting_input')
                       AND NOT r.test
                    OFFSET 0)
                   UNION ALL
                   (SELECT h.id, h.created_at FROM runs h
                     WHERE h.owner = s.owner AND h.state = 'running' AND h.schedule_id = s.id AND NOT h.test
                    OFFSET 0)) AS a
            ORDER BY a.created_at DESC, a.id DESC
            LIMIT 1) END AS active_run_id,
       CASE WHEN s.overlap = 'queue_one' THEN (
           SELECT r.id FROM runs r
            WHERE r.schedule_id = s.id AND r.state = 'queued' AND r.blocked_by_run_id IS NOT NULL
            LIMIT 1) END AS waiting_run_id
  FROM schedules s
 WHERE s.status = 'active'
   AND s.next_dispatch_at <= coalesce(%(now)s::timestamptz, now())
   AND (s.next_dispatch_at, s.id) > (%(after_at)s::timestamptz, %(after_id)s::uuid)
   AND (%(parts)s::bigint <= 1
        OR int8eq(mod(hashtextextended(s.owner, 0) & 2147483647, %(parts)s::bigint), %(part)s::bigint))
 ORDER BY s.next_dispatch_at, s.id
 LIMIT %(limit)s
   FOR NO KEY UPDATE OF s SKIP LOCKED;

-- name: schedules_advance_cursor
-- Moves each cursor past now, guarded by the value read; completes schedules with no next fire.
UPDATE schedules AS s
   SET next_fire_at = u.next_fire_at,
       last_fire_at = coalesce(u.last_fire_at, s.last_fire_at),
       fire_count = s.fire_count + u.runs_created,
       status = CASE WHEN u.completed THEN 'completed' ELSE s.status END,
       revision = s.revision + CASE WHEN u.completed THEN 1 ELSE 0 END,
       updated_at = CASE WHEN u.completed THEN coalesce(%(now)s::timestamptz, now()) ELSE s.updated_at END
  FROM jsonb_to_recordset(%(moves)s::jsonb)
       AS u(id uuid, read_next_fire_at timestamptz, next_fire_at timestamptz, last_fire_at timestamptz,
            runs_created integer, completed boolean)
 WHERE s.id = u.id
   AND s.status = 'active'
   AND s.next_fire_at = u.read_next_fire_at
RETURNING s.id;

-- name: schedules_pause_by_tick
-- active -> paused for schedules the tick stops (3 failures in a row, a rule that no longer evaluates),
-- with when and why (resume records the fires that fell in the pause).
UPDATE schedules
   SET status = 'paused',
       paused_at = coalesce(%(now)s::timestamptz, now()),
       paused_reason = %(reason)s,
       revision = revision + 1,
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = ANY(%(ids)s::uuid[]) AND status = 'active'
RETURNING id, conversation_id, consecutive_failures;

-- name: schedules_lock_unsettled
-- Locks (skipping held ones) the schedules that have ended runs not yet accounted for.
SELECT s.id, s.owner, s.status, s.consecutive_failures, s.conversation_id, s.notify
  FROM schedules s
 WHERE s.id IN (SELECT r.schedule_id
                  FROM runs r
                 WHERE r.finished_at IS NOT NULL AND r.settled_at IS NULL
                 ORDER BY r.finished_at
                 LIMIT %(limit)s)
 ORDER BY s.id
   FOR NO KEY UPDATE OF s SKIP LOCKED;

-- name: schedules_set_failures
-- Writes the consecutive failure counts computed by the settle step for schedules it holds locked.
UPDATE schedules AS s
   SET consecutive_failures = u.failures
  FROM unnest(%(ids)s::uuid[], %(failures)s::integer[]) AS u(id, failures)
 WHERE s.id = u.id AND s.consecutive_failures IS DISTINCT FROM u.failures;

-- name: schedules_find_hook
-- The active webhook schedule presenting this token hash (current, or previous before it expires), locked, with the database time.
SELECT s.id, s.owner, s.conversation_id, s.prompt, s.mode, s.catch_up, s.timezone, s.revision, s.signing,
       s.rate_limit_per_minute, s.token_hash, s.previous_token_hash, s.flow, s.limits,
       coalesce(s.agent, c.agent) AS agent,
       coalesce(%(now)s::timestamptz, now()) AS now
  FROM schedules s
  JOIN conversations c ON c.id = s.conversation_id
 WHERE s.kind = 'webhook'
   AND s.status = 'active'
   AND (s.token_hash = %(token_hash)s
        OR (s.previous_token_hash = %(token_hash)s
            AND s.previous_token_expires_at > coalesce(%(now)s::timestamptz, now())))
   FOR NO KEY UPDATE OF s;

-- name: schedules_rotate_token
-- Replaces a webhook schedule's token hash; the old hash stays valid for the overlap (none when 0 s).
UPDATE schedules
   SET previous_token_hash = CASE WHEN %(overlap_seconds)s::integer > 0 THEN token_hash END,
       previous_token_expires_at = CASE WHEN %(overlap_seconds)s::integer > 0
                                        THEN coalesce(%(now)s::timestamptz, now())
                                             + make_interval(secs => %(overlap_seconds)s::integer)
                                   END,
       token_hash = %(token_hash)s,
       revision = revision + 1,
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = %(id)s
   AND owner = %(owner)s
   AND kind = 'webhook'
   AND status IN ('active', 'paused')
RETURNING id, revision, previous_token_expires_at;

-- name: schedules_ops_list
-- Operators: schedules of every owner (or one), not cancelled unless asked, oldest first.
SELECT * FROM schedules
 WHERE (%(owner)s::text IS NULL OR owner = %(owner)s)
   AND (%(all)s OR status <> 'cancelled')
 ORDER BY created_at, id
 LIMIT %(limit)s;

-- name: schedules_ops_get
-- Operators: one schedule whoever owns it.
SELECT * FROM schedules WHERE id = %(id)s;

-- name: schedules_ops_status
-- Operators: the due backlog (active timed schedules whose next fire has passed) and its oldest fire.
SELECT count(*) AS due,
       min(next_dispatch_at) AS oldest_due_at,
       coalesce(%(now)s::timestamptz, now()) AS now
  FROM schedules
 WHERE status = 'active' AND next_dispatch_at <= coalesce(%(now)s::timestamptz, now());

-- name: schedules_clock
-- The instant schedule decisions use: the injected now, else the database clock.
SELECT coalesce(%(now)s::timestamptz, now()) AS now;

-- name: schedules_insert
-- Creates one schedule; the caller holds the conversation lock and has counted its schedules.
INSERT INTO schedules (
    id, owner, conversation_id, name, prompt, kind, cron, interval_seconds, starts_at, ends_at,
    max_occurrences, timezone, dst_gap, dst_fold, mode, catch_up, max_delay_seconds, overlap, agent, signing,
    notify, next_fire_at, token_hash, created_by_run_id, created_at, updated_at, corpus, flow, jitter_seconds, limits
) VALUES (
    %(id)s, %(owner)s, %(conversation_id)s, %(name)s, %(prompt)s, %(kind)s, %(cron)s, %(interval_seconds)s,
    %(starts_at)s, %(ends_at)s, %(max_occurrences)s, %(timezone)s, %(dst_gap)s, %(dst_fold)s, %(mode)s,
    %(catch_up)s, %(max_delay_seconds)s, %(overlap)s, %(agent)s, %(signing)s, %(notify)s, %(next_fire_at)s,
    %(token_hash)s, %(created_by_run_id)s, coalesce(%(now)s::timestamptz, now()), coalesce(%(now)s::timestamptz, now()),
    %(corpus)s, %(flow)s, %(jitter_seconds)s, %(limits)s
)
RETURNING *;

-- name: schedules_get
-- One schedule of one owner; a foreign schedule answers like a missing one.
SELECT * FROM schedules WHERE id = %(schedule_id)s AND owner = %(owner)s;

-- name: schedules_list
-- The owner's schedules that are not cancelled, optionally of one conversation, oldest first.
SELECT *
  FROM schedules
 WHERE owner = %(owner)s
   AND (%(conversation_id)s::uuid IS NULL OR conversation_id = %(conversation_id)s::uuid)
   AND status <> 'cancelled'
 ORDER BY created_at, id;

-- name: schedules_count_open
-- Schedules of a conversation that still count against its limit (not cancelled, not completed).
SELECT count(*) AS open FROM schedules
 WHERE conversation_id = %(conversation_id)s AND status IN ('draft', 'active', 'paused');

-- name: schedules_pause
-- active -> paused (the API), with when and the owner's reason. The cursor is kept; resume recomputes it.
UPDATE schedules
   SET status = 'paused',
       paused_at = coalesce(%(now)s::timestamptz, now()),
       paused_reason = %(reason)s,
       revision = revision + 1,
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = %(schedule_id)s AND owner = %(owner)s AND status = 'active'
RETURNING *;

-- name: schedules_resume
-- paused (or a loop's draft) -> active with no failures and the next fire computed from now, for the
-- revision read. A loop no longer waits on a run's question once its owner resumes it.
UPDATE schedules
   SET status = 'active',
       input_run_id = NULL,
       paused_at = NULL,
       paused_reason = NULL,
       consecutive_failures = 0,
       next_fire_at = %(next_fire_at)s::timestamptz,
       revision = revision + 1,
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = %(schedule_id)s AND owner = %(owner)s AND status IN ('paused', 'draft') AND revision = %(revision)s
RETURNING *;

-- name: schedules_cancel
-- active, paused or draft -> cancelled (final). The cursor is cleared; runs already claimed still finish.
UPDATE schedules
   SET status = 'cancelled',
       next_fire_at = NULL,
       input_run_id = NULL,
       revision = revision + 1,
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = %(schedule_id)s AND owner = %(owner)s AND status IN ('active', 'paused', 'draft')
RETURNING *;

-- name: schedules_lock_owned
-- One schedule of one owner, locked for an edit, a trigger or a backfill (the tick skips it meanwhile).
SELECT *, coalesce(%(now)s::timestamptz, now()) AS db_now
  FROM schedules WHERE id = %(schedule_id)s AND owner = %(owner)s
   FOR NO KEY UPDATE;

-- name: schedules_edit
-- A new revision of the definition (PATCH), for the revision read; active and paused keep their
-- status. The trigger on schedules records the revision in schedule_revisions.
UPDATE schedules
   SET name = %(name)s, prompt = %(prompt)s, kind = %(kind)s, cron = %(cron)s,
       interval_seconds = %(interval_seconds)s, starts_at = %(starts_at)s, ends_at = %(ends_at)s,
       max_occurrences = %(max_occurrences)s, timezone = %(timezone)s, dst_gap = %(dst_gap)s,
       dst_fold = %(dst_fold)s, mode = %(mode)s, catch_up = %(catch_up)s,
       max_delay_seconds = %(max_delay_seconds)s, overlap = %(overlap)s, agent = %(agent)s,
       signing = %(signing)s, notify = %(notify)s, corpus = %(corpus)s, flow = %(flow)s,
       next_fire_at = %(next_fire_at)s::timestamptz, jitter_seconds = %(jitter_seconds)s,
       limits = %(limits)s,
       revision = revision + 1,
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = %(schedule_id)s AND owner = %(owner)s AND revision = %(revision)s
   AND status IN ('active', 'paused')
RETURNING *;

-- name: schedules_hold_owner_queues
-- Takes the queue lock of each owner of these schedules and of these conversations (a chat turn has
-- no schedule) — transaction-level advisory locks, in owner order so two batches never wait on each
-- other crosswise — before a fire is recorded: fires of one owner serialize from here to their commit,
-- so occurrences_insert counts every earlier queued run.
SELECT o.owner, pg_advisory_xact_lock(hashtextextended('kairos.owner_queue:' || o.owner, 0)) IS NOT NULL AS held
  FROM (SELECT owner FROM schedules WHERE id = ANY(%(schedule_ids)s::uuid[])
        UNION
        SELECT owner FROM conversations WHERE id = ANY(%(conversation_ids)s::uuid[])
        ORDER BY owner) AS o;

-- name: schedules_hold_owner_slots
-- Takes the slot lock of each owner of these schedules ('kairos.owner_slots:', as kairos_release_slots
-- does), in owner order, until the transaction ends: the tick's fire, after the owners' queue locks and
-- before occurrences_insert, so that statement's snapshot sees every release and end committed before
-- and may insert runs already holding a slot (admit; kairos.tick.fire).
SELECT o.owner, pg_advisory_xact_lock(hashtextextended('kairos.owner_slots:' || o.owner, 0)) IS NOT NULL AS held
  FROM (SELECT DISTINCT owner FROM schedules WHERE id = ANY(%(schedule_ids)s::uuid[]) ORDER BY owner) AS o;

-- name: schedules_insert_loop
-- Creates one goal loop (POST /v1/loops): its fixed policies, its goal at revision 1, active.
INSERT INTO schedules (
    id, owner, conversation_id, name, prompt, kind, cron, interval_seconds, starts_at, ends_at,
    max_occurrences, timezone, dst_gap, dst_fold, mode, catch_up, max_delay_seconds, overlap, agent, signing,
    notify, next_fire_at, created_at, updated_at, loop, goal, goal_revision
) VALUES (
    %(id)s, %(owner)s, %(conversation_id)s, %(name)s, %(prompt)s, %(kind)s, %(cron)s, %(interval_seconds)s,
    %(starts_at)s, %(ends_at)s, %(max_occurrences)s, %(timezone)s, %(dst_gap)s, %(dst_fold)s, 'append',
    false, %(max_delay_seconds)s, 'skip', %(agent)s, NULL, %(notify)s, %(next_fire_at)s,
    coalesce(%(now)s::timestamptz, now()), coalesce(%(now)s::timestamptz, now()), true, %(goal)s, 1
)
RETURNING *;

-- name: schedules_edit_loop
-- A loop's new revision (PATCH /v1/loops): its rule, prompt and bounds; with a new goal (goal given)
-- the goal moves to this revision (schedules_loop_draft follows). Guarded by the revision read; a
-- loop's fixed policies are not columns this statement writes.
UPDATE schedules
   SET name = %(name)s, prompt = %(prompt)s, kind = %(kind)s, cron = %(cron)s,
       interval_seconds = %(interval_seconds)s, starts_at = %(starts_at)s, ends_at = %(ends_at)s,
       max_occurrences = %(max_occurrences)s, timezone = %(timezone)s, dst_gap = %(dst_gap)s,
       dst_fold = %(dst_fold)s, max_delay_seconds = %(max_delay_seconds)s,
       next_fire_at = %(next_fire_at)s::timestamptz,
       goal = coalesce(%(goal)s, goal),
       goal_revision = CASE WHEN %(goal)s::jsonb IS NULL THEN goal_revision ELSE revision + 1 END,
       input_run_id = CASE WHEN %(goal)s::jsonb IS NULL THEN input_run_id END,
       revision = revision + 1,
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = %(schedule_id)s AND owner = %(owner)s AND loop AND revision = %(revision)s
   AND status IN ('draft', 'active', 'paused')
RETURNING *;

-- name: schedules_loop_draft
-- active or paused -> draft after a goal edit, in the edit's own revision: nothing fires until its
-- owner resumes it.
UPDATE schedules
   SET status = 'draft'
 WHERE id = %(schedule_id)s AND owner = %(owner)s AND loop AND status IN ('active', 'paused')
RETURNING *;

-- name: schedules_lock_loop
-- A loop locked by its run's goal report (any owner: the worker acts for the run's owner).
SELECT *, coalesce(%(now)s::timestamptz, now()) AS db_now
  FROM schedules WHERE id = %(schedule_id)s AND loop
   FOR NO KEY UPDATE;

-- name: schedules_loop_wait
-- active -> paused for the run that asked its owner a question (goal_report: needs_input).
UPDATE schedules
   SET status = 'paused',
       input_run_id = %(run_id)s,
       paused_at = coalesce(%(now)s::timestamptz, now()),
       paused_reason = 'the loop asked its owner a question',
       revision = revision + 1,
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = %(schedule_id)s AND loop AND status = 'active'
RETURNING id, status, revision;

-- name: schedules_loop_continue
-- paused -> active at the next future fire (or completed when nothing is left to fire), once the run
-- the loop waited on reports continue after its owner's answer.
UPDATE schedules
   SET status = CASE WHEN %(next_fire_at)s::timestamptz IS NULL THEN 'completed' ELSE 'active' END,
       next_fire_at = %(next_fire_at)s::timestamptz,
       input_run_id = NULL,
       paused_at = NULL,
       paused_reason = NULL,
       revision = revision + 1,
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = %(schedule_id)s AND loop AND status = 'paused' AND input_run_id = %(run_id)s
RETURNING id, status, revision;

-- name: schedules_loop_complete
-- active or paused -> completed: a loop run reported its goal complete. No more fires.
UPDATE schedules
   SET status = 'completed',
       next_fire_at = NULL,
       input_run_id = NULL,
       revision = revision + 1,
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = %(schedule_id)s AND loop AND status IN ('active', 'paused')
RETURNING id, status, revision;

-- name: schedules_loop_block
-- active -> paused: a loop run reported its goal blocked; its owner resumes it.
UPDATE schedules
   SET status = 'paused',
       paused_at = coalesce(%(now)s::timestamptz, now()),
       paused_reason = 'the loop reported its goal blocked',
       revision = revision + 1,
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = %(schedule_id)s AND loop AND status = 'active'
RETURNING id, status, revision;

-- name: schedules_loop_release
-- A paused loop no longer waits on this run (it reported blocked after its answer): it stays paused.
UPDATE schedules
   SET input_run_id = NULL,
       updated_at = coalesce(%(now)s::timestamptz, now())
 WHERE id = %(schedule_id)s AND input_run_id = %(run_id)s
RETURNING id, status, revision;

-- name: schedules_owner_status
-- The console's operator status (GET /v1/status): one owner's due backlog and its oldest due fire.
SELECT count(*) AS due,
       min(next_dispatch_at) AS oldest_due_at,
       coalesce(%(now)s::timestamptz, now()) AS now
  FROM schedules
 WHERE owner = %(owner)s AND status = 'active' AND next_dispatch_at <= coalesce(%(now)s::timestamptz, now());
