-- occurrences: the immutable record of each fire (scheduled by the tick, or one accepted webhook
-- delivery), inserted idempotently with the queued run it produced.

-- name: occurrences_insert
-- The one way a fire is recorded: its immutable occurrence, the queued run it produced (when it
-- produced one) and that run's run.queued event (seq 1), idempotently, for a tick's batch of scheduled
-- fires, one accepted webhook delivery, a trigger, a retry, a backfill and a chat turn alike. The run
-- executes the revision its occurrence records (schedule_revisions): that revision's prompt, mode and
-- agent (else the conversation's), in the schedule's conversation; a chat turn (no schedule) brings
-- its conversation, prompt and mode and runs the conversation's agent. The occurrence's dispatch_at is
-- the one given (a jittered fire's) or its fire_at. A scheduled run claimable at once
-- without catch-up expires at dispatch_at + the schedule's max_delay_seconds; a queued-behind run gets its
-- expiry when it is released (runs_release_blocked); a webhook run does not expire. The owner's queue
-- cap (queue_max, KAIROS_OWNER_QUEUE_MAX) is applied here: see `planned`. A test run (source test) is
-- marked `test` and, for an append schedule, forks its conversation instead of writing to it.
-- The run records its limits (the defaults and caps are parameters: kairos.limits.sql_parameters), the
-- revision it executes and its agent's digest.
-- A run is inserted holding no slot (owner_slots, KAIROS_OWNER_CONCURRENCY, is its owner's limit; a
-- webhook run may bring its concurrency key and limit): the caller's handoff releases free slots.
-- With admit (the tick's fire, holding its owners' slot locks: schedules_hold_owner_slots), a run is
-- inserted already holding a slot (admitted_at, released_by NULL: the fire sends it) when
-- kairos_release_slots would admit it at once: nothing of its owner waits for a slot (queued, not
-- admitted, not blocked, not paused, its hold due), it is not queued behind another run, it has no
-- concurrency key, and it is among the first (limit - held) of its owner's new runs in run id order.
-- The others wait, as any queued run, for a release.
WITH given AS (
    SELECT p.*, e.ordinal, coalesce(s.owner, cv.owner) AS owner
      FROM jsonb_array_elements(%(occurrences)s::jsonb) WITH ORDINALITY AS e(doc, ordinal)
     CROSS JOIN LATERAL jsonb_to_record(e.doc)
           AS p(occurrence_id uuid, schedule_id uuid, source text, fire_at timestamptz, local_time timestamp,
                utc_offset_seconds integer, fold smallint, timezone text, tzdata_version text, revision integer,
                decision text, covers_from timestamptz, covers_until timestamptz, covers_count integer,
                idempotency_key text, key_generation integer, run_id uuid, blocked_by uuid, payload jsonb,
                retry_of uuid, conversation_id uuid, prompt text, mode text, corpus jsonb, coalesced_into uuid,
                dispatch_at timestamptz, concurrency_key text, concurrency_limit integer)
      LEFT JOIN schedules s ON s.id = p.schedule_id
      LEFT JOIN conversations cv ON cv.id = p.conversation_id AND p.schedule_id IS NULL  -- a chat turn
), queued AS (
    -- Each owner's queued runs now, counted up to the cap (the caller holds the owners' queue locks).
    SELECT o.owner, (SELECT count(*) FROM (SELECT 1 FROM runs q WHERE q.owner = o.owner AND q.state = 'queued'
                                             LIMIT %(queue_max)s) AS n) AS n
      FROM (SELECT DISTINCT owner FROM given WHERE owner IS NOT NULL) AS o
), slots AS (
    -- admit only: each owner's slots held now and whether a run of it waits for one (the caller holds
    -- the owners' slot locks, so no release or end of theirs commits until this transaction does).
    SELECT o.owner,
           (SELECT count(*) FROM (SELECT 1 FROM runs h
                                   WHERE h.owner = o.owner AND (h.state = 'running' OR h.admitted_at IS NOT NULL)
                                   LIMIT %(owner_slots)s) AS n) AS held,
           -- owner COLLATE "C": only runs_slot_waiting_idx can serve it (migration 0048), never a walk
           -- of the owner's runs, whatever the statistics.
           EXISTS (SELECT 1 FROM runs w
                    WHERE w.owner COLLATE "C" = o.owner AND w.state = 'queued' AND w.admitted_at IS NULL
                      AND w.blocked_by_run_id IS NULL AND w.paused_at IS NULL
                      AND (w.held_until IS NULL OR w.held_until <= coalesce(%(now)s::timestamptz, now()))) AS waiting
      FROM (SELECT DISTINCT owner FROM given
             WHERE %(admit)s::boolean AND owner IS NOT NULL AND schedule_id IS NOT NULL) AS o
), planned AS (
    -- A row that would make more than queue_max runs of its owner queued (in batch order) is recorded
    -- skipped_budget, without a run (and a row queued behind it would have nothing to wait for: it
    -- comes later in the batch, so it is over the cap too).
    SELECT g.occurrence_id, g.schedule_id, g.source, g.fire_at, g.local_time, g.utc_offset_seconds, g.fold,
           g.timezone, g.tzdata_version, g.revision,
           CASE WHEN g.over THEN 'skipped_budget' ELSE g.decision END AS decision,
           g.covers_from, g.covers_until, g.covers_count, g.idempotency_key, g.key_generation,
           CASE WHEN g.over THEN NULL ELSE g.run_id END AS run_id, g.blocked_by, g.payload, g.retry_of,
           g.conversation_id, g.prompt, g.mode, g.corpus, g.coalesced_into,
           coalesce(g.dispatch_at, g.fire_at) AS dispatch_at, g.concurrency_key, g.concurrency_limit, g.owner
      FROM (SELECT given.*,
                   coalesce(given.run_id IS NOT NULL
                            AND q.n + count(given.run_id) OVER (PARTITION BY given.owner ORDER BY given.ordinal)
                                > %(queue_max)s, false) AS over
              FROM given LEFT JOIN queued q ON q.owner = given.owner) AS g
), admits AS (
    -- admit only: the new runs that take a free slot of their owner at once (see above).
    SELECT e.run_id, e.owner
      FROM (SELECT p.run_id, p.owner, row_number() OVER (PARTITION BY p.owner ORDER BY p.run_id) AS n
              FROM planned p
             WHERE p.run_id IS NOT NULL AND p.schedule_id IS NOT NULL AND p.blocked_by IS NULL
               AND p.concurrency_key IS NULL) AS e
      JOIN slots sl ON sl.owner = e.owner
     WHERE NOT sl.waiting AND e.n <= %(owner_slots)s - sl.held
), occ AS (
    INSERT INTO occurrences (id, schedule_id, source, fire_at, local_time, utc_offset, fold, timezone,
                             tzdata_version, schedule_revision, decision, covers_from, covers_until,
                             covers_count, idempotency_key, key_generation, created_at, coalesced_into, dispatch_at)
    SELECT occurrence_id, schedule_id, source, fire_at, local_time, make_interval(secs => utc_offset_seconds),
           fold, timezone, tzdata_version, revision, decision, covers_from, covers_until, covers_count,
           idempotency_key, coalesce(key_generation, 0), coalesce(%(now)s::timestamptz, now()), coalesced_into,
           dispatch_at
      FROM planned
        ON CONFLICT DO NOTHING
    RETURNING id, schedule_id, decision
), new_runs AS (
    INSERT INTO runs (id, occurrence_id, schedule_id, owner, source, source_conversation_id, mode, prompt,
                      payload, agent, catch_up, state, blocked_by_run_id, expires_at, last_seq, created_at,
                      updated_at, retry_of, corpus, test, runtime_limit_seconds, max_attempts, max_steps,
                      schedule_revision, agent_digest, slot_limit, concurrency_key, concurrency_limit, admitted_at)
    SELECT p.run_id, occ.id, s.id, c.owner, p.source, c.id,
           -- A test run never writes into the schedule's conversation: an append schedule's test forks it.
           CASE WHEN p.source = 'test' AND coalesce(d.mode, p.mode) = 'append' THEN 'fork'
                ELSE coalesce(d.mode, p.mode) END,
           coalesce(d.prompt, p.prompt),
           p.payload, a.agent, coalesce(d.catch_up, false), 'queued', p.blocked_by,
           CASE WHEN p.source = 'scheduled' AND NOT d.catch_up AND p.blocked_by IS NULL
                THEN p.dispatch_at + make_interval(secs => d.max_delay_seconds) END,
           1, coalesce(%(now)s::timestamptz, now()), coalesce(%(now)s::timestamptz, now()), p.retry_of,
           coalesce(d.corpus, p.corpus), p.source = 'test',
           -- The run's limits (kairos.limits.effective): the schedule's limits in force now, else its
           -- agent's, else the default; never above the server's cap.
           least(coalesce((s.limits ->> 'runtime_seconds')::integer, (a.agent #>> '{limits,runtime_seconds}')::integer,
                          %(default_runtime_seconds)s), %(cap_runtime_seconds)s),
           least(coalesce((s.limits ->> 'max_attempts')::integer, (a.agent #>> '{limits,max_attempts}')::integer,
                          %(default_max_attempts)s), %(cap_max_attempts)s),
           least(coalesce((s.limits ->> 'max_steps')::integer, (a.agent #>> '{limits,max_steps}')::integer,
                          (a.agent ->> 'max_steps')::integer, %(default_max_steps)s), %(cap_max_steps)s),
           CASE WHEN s.id IS NOT NULL THEN p.revision END, kairos_agent_digest(a.agent),
           %(owner_slots)s, p.concurrency_key, p.concurrency_limit,
           CASE WHEN ad.owner = c.owner THEN coalesce(%(now)s::timestamptz, now()) END
      FROM occ
      JOIN planned p ON p.occurrence_id = occ.id
      LEFT JOIN admits ad ON ad.run_id = p.run_id
      LEFT JOIN schedules s ON s.id = occ.schedule_id
      LEFT JOIN schedule_revisions rv ON rv.schedule_id = occ.schedule_id AND rv.revision = p.revision
      LEFT JOIN LATERAL jsonb_to_record(rv.definition)
           AS d(mode text, prompt text, agent jsonb, catch_up boolean, max_delay_seconds integer, corpus jsonb) ON true
      JOIN conversations c ON c.id = coalesce(s.conversation_id, p.conversation_id)
     CROSS JOIN LATERAL (SELECT coalesce(d.agent, c.agent) AS agent) AS a
     WHERE p.run_id IS NOT NULL
        ON CONFLICT DO NOTHING
    RETURNING id, occurrence_id, source, blocked_by_run_id, attempt, fence, retry_of, admitted_at IS NOT NULL AS admitted
), queued_events AS (
    INSERT INTO run_event_batches (run_id, last_seq, at, attempt, fence, events)
    SELECT id, 1, coalesce(%(now)s::timestamptz, now()), attempt, fence,
           jsonb_build_array(jsonb_build_object(
               'type', 'run.queued',
               'data', jsonb_strip_nulls(jsonb_build_object('source', source, 'occurrence_id', occurrence_id,
                                                            'blocked_by_run_id', blocked_by_run_id,
                                                            'retry_of', retry_of))))
      FROM new_runs
)
SELECT occ.id AS occurrence_id, occ.schedule_id, occ.decision, r.id AS run_id, r.blocked_by_run_id,
       coalesce(r.admitted, false) AS admitted
  FROM occ
  LEFT JOIN new_runs r ON r.occurrence_id = occ.id;

-- name: occurrences_hook_key_generation
-- The generation the next use of a webhook key makes: one past the newest occurrence it made, else 0.
SELECT coalesce(max(key_generation) + 1, 0) AS generation
  FROM occurrences
 WHERE schedule_id = %(schedule_id)s
   AND source = 'webhook'
   AND idempotency_key = %(idempotency_key)s;

-- name: occurrences_of_run
-- The occurrence a run came from, with whether its revision is on record (a retry re-executes it).
SELECT o.*, EXISTS (SELECT 1 FROM schedule_revisions rv
                     WHERE rv.schedule_id = o.schedule_id AND rv.revision = o.schedule_revision) AS revision_kept
  FROM occurrences o JOIN runs r ON r.occurrence_id = o.id
 WHERE r.id = %(run_id)s;

-- name: occurrences_in_window
-- A schedule's timed occurrences (scheduled and backfill) with fire_at in [from, until), oldest first,
-- with the run each made: what a backfill leaves alone or converges on.
SELECT o.id, o.source, o.fire_at, o.local_time, o.utc_offset, o.fold, o.schedule_revision, o.decision,
       r.id AS run_id
  FROM occurrences o
  LEFT JOIN runs r ON r.occurrence_id = o.id
 WHERE o.schedule_id = %(schedule_id)s AND o.source IN ('scheduled', 'backfill')
   AND o.fire_at >= %(from)s AND o.fire_at < %(until)s
 ORDER BY o.fire_at, o.source;

-- name: occurrences_list
-- One keyset page of a schedule's occurrences (the caller has checked its owner), newest first:
-- (fire_at, id) strictly below the cursor (kairos.pages), each with the run it produced, if any (a
-- coalesced delivery: the run it folded into).
-- Reads occurrences_schedule_idx; limit is the page size plus one.
SELECT o.id, o.source, o.fire_at, coalesce(o.dispatch_at, o.fire_at) AS dispatch_at, o.local_time, o.utc_offset,
       o.fold, o.schedule_revision, o.decision, o.covers_from, o.covers_until, o.covers_count,
       coalesce(r.id, o.coalesced_into) AS run_id
  FROM occurrences o
  LEFT JOIN runs r ON r.occurrence_id = o.id
 WHERE o.schedule_id = %(schedule_id)s
   AND (%(before_at)s::timestamptz IS NULL
        OR (o.fire_at, o.id) < (%(before_at)s::timestamptz, %(before_id)s::uuid))
 ORDER BY o.fire_at DESC, o.id DESC
 LIMIT %(limit)s;
