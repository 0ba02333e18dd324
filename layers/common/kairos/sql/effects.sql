-- The effects ledger (kairos.effects): one row per external call, reserved under the run's fence
-- before the call and closed after it. Every statement the worker runs here checks and locks the run
-- row first (the `authority` CTE), so a worker that lost its lease reserves and settles nothing; the
-- tick's rescue closes the effects of runs whose lease expired (it holds those runs locked).

-- name: effects_close_vanished
-- Closes effects a vanished worker left reserved: mutations become ambiguous, others failed.
UPDATE effects
   SET state = CASE WHEN mutation THEN 'ambiguous' ELSE 'failed' END,
       error_code = 'lease_lost',
       settled_at = coalesce(%(now)s::timestamptz, now())
 WHERE run_id = ANY(%(run_ids)s::uuid[]) AND state = 'reserved'
RETURNING id, run_id, state, charge_day;

-- name: effects_unreplayable_runs
-- The runs among these with a mutation that may have reached the outside world (never replayed).
SELECT DISTINCT run_id
  FROM effects
 WHERE run_id = ANY(%(run_ids)s::uuid[]) AND mutation AND state NOT IN ('failed', 'not_sent_test');

-- name: effects_reserve (prepared)
-- Reserves one external effect for the current fence holder, unless a cancel was requested, and
-- traces effect.reserved (with the caller's extra counts, e.g. the model input window), in one statement (zero rows: the fence is stale or the run is cancelling).
-- The id is the caller's when it names one (effect_id), so the budget's reservation can be sent with it.
WITH authority AS (
    UPDATE runs
       SET last_seq = last_seq + 1
     WHERE id = %(run_id)s AND fence = %(fence)s AND attempt = %(attempt)s AND state = 'running'
       AND cancel_requested_at IS NULL
    RETURNING id, last_seq, attempt, fence
), reserved AS (
    INSERT INTO effects (id, run_id, fence, attempt, step, kind, mutation, target, request_digest, created_at)
    SELECT coalesce(%(effect_id)s::uuid, gen_random_uuid()), a.id, a.fence, a.attempt, %(step)s, %(kind)s,
           %(mutation)s, %(target)s, %(digest)s,
           coalesce(%(now)s::timestamptz, now())
      FROM authority a
    RETURNING id, run_id, fence, attempt, step, kind, mutation, target, request_digest, state, usage, error_code,
              created_at, settled_at
), traced AS (
    INSERT INTO run_event_batches (run_id, last_seq, at, attempt, fence, events)
    SELECT a.id, a.last_seq, coalesce(%(now)s::timestamptz, now()), a.attempt, a.fence,
           jsonb_build_array(jsonb_build_object(
               'type', 'effect.reserved', 'step', r.step,
               'data', jsonb_build_object('effect_id', r.id, 'kind', r.kind, 'mutation', r.mutation)
                           || coalesce(%(data)s::jsonb, '{}'::jsonb)))
      FROM authority a CROSS JOIN reserved r
)
SELECT * FROM reserved;

-- name: effects_reserve_charged (prepared)
-- effects_reserve for a model call, with its budget charge (as usage_ledger_reserve) in the same
-- statement, so that on an autocommit connection the reservation, the charge and their commit are one
-- round trip. Writes nothing at all unless the fence holds, no cancel was requested and the charge
-- fits both of the owner's daily ceilings. One row always: `authorized` (the fence held and no cancel
-- was requested) and the reserved effect's columns (NULL when nothing was reserved: not authorized,
-- or the budget is exhausted). The stripe of the owner's day the charge is booked on
-- (kairos_usage_reserve, migration 0041) is locked to the commit, as with usage_ledger_reserve; the run
-- row first, as every worker statement. The reservation is the effect's charge_* columns (what
-- usage_reservations shows) and charge_stripe.
WITH authority AS (
    SELECT id, owner
      FROM runs
     WHERE id = %(run_id)s AND fence = %(fence)s AND attempt = %(attempt)s AND state = 'running'
       AND cancel_requested_at IS NULL
       FOR NO KEY UPDATE
), want AS (
    SELECT a.owner, (coalesce(%(now)s::timestamptz, now()) AT TIME ZONE 'UTC')::date AS day,
           %(tokens)s::bigint AS tokens, %(cost_usd)s::numeric AS cost_usd
      FROM authority a
), booked AS (
    SELECT w.day, w.tokens, w.cost_usd,
           kairos_usage_reserve(w.owner, w.day, w.tokens, w.cost_usd, %(max_tokens)s::bigint,
                                %(max_cost_usd)s::numeric, %(stripe_first)s::integer) AS stripe
      FROM want w
), bumped AS (
    UPDATE runs r
       SET last_seq = r.last_seq + 1
      FROM authority a
     WHERE r.id = a.id AND EXISTS (SELECT 1 FROM booked WHERE stripe IS NOT NULL)
    RETURNING r.id, r.last_seq, r.attempt, r.fence
), reserved AS (
    -- The effect carries its reservation (charge_*, migration 0033): given back or replaced by the
    -- call's usage when it closes.
    INSERT INTO effects (id, run_id, fence, attempt, step, kind, mutation, target, request_digest, created_at,
                         charge_day, charge_tokens, charge_cost_usd, charge_stripe)
    SELECT %(effect_id)s::uuid, a.id, a.fence, a.attempt, %(step)s, %(kind)s, %(mutation)s, %(target)s, %(digest)s,
           coalesce(%(now)s::timestamptz, now()), b.day, b.tokens, b.cost_usd, b.stripe
      FROM bumped a CROSS JOIN booked b
     WHERE b.stripe IS NOT NULL
    RETURNING id, run_id, fence, attempt, step, kind, mutation, target, request_digest, state, usage, error_code,
              created_at, settled_at
), traced AS (
    INSERT INTO run_event_batches (run_id, last_seq, at, attempt, fence, events)
    SELECT a.id, a.last_seq, coalesce(%(now)s::timestamptz, now()), a.attempt, a.fence,
           jsonb_build_array(jsonb_build_object(
               'type', 'effect.reserved', 'step', r.step,
               'data', jsonb_build_object('effect_id', r.id, 'kind', r.kind, 'mutation', r.mutation)
                           || coalesce(%(data)s::jsonb, '{}'::jsonb)))
      FROM bumped a CROSS JOIN reserved r
)
SELECT EXISTS (SELECT 1 FROM authority) AS authorized, r.id, r.run_id, r.fence, r.attempt, r.step, r.kind, r.mutation,
       r.target, r.request_digest, r.state, r.usage, r.error_code, r.created_at, r.settled_at
  FROM (SELECT 1) AS one
  LEFT JOIN reserved r ON true;

-- name: effects_close (prepared)
-- Moves one reserved effect of the fence holder to settled, failed or ambiguous.
WITH authority AS (
    SELECT id FROM runs
     WHERE id = %(run_id)s AND fence = %(fence)s AND state = 'running'
       FOR NO KEY UPDATE
)
UPDATE effects e
   SET state = %(state)s,
       usage = %(usage)s,
       error_code = %(error_code)s,
       settled_at = coalesce(%(now)s::timestamptz, now())
  FROM authority a
 WHERE e.id = %(effect_id)s AND e.run_id = a.id AND e.fence = %(fence)s AND e.state = 'reserved'
RETURNING e.id, e.run_id, e.fence, e.attempt, e.step, e.kind, e.mutation, e.target, e.request_digest, e.state,
          e.usage, e.error_code, e.created_at, e.settled_at;

-- name: effects_close_stale
-- On a new claim: effects left reserved by an earlier fence become ambiguous (mutations) or failed.
WITH authority AS (
    SELECT id FROM runs
     WHERE id = %(run_id)s AND fence = %(fence)s AND state = 'running'
       FOR NO KEY UPDATE
)
UPDATE effects e
   SET state = CASE WHEN e.mutation THEN 'ambiguous' ELSE 'failed' END,
       error_code = 'lease_lost',
       settled_at = coalesce(%(now)s::timestamptz, now())
  FROM authority a
 WHERE e.run_id = a.id AND e.fence < %(fence)s AND e.state = 'reserved'
RETURNING e.*;

-- name: effects_replay_blockers
-- Mutations that may have reached the outside world: while one exists the run is never replayed.
SELECT * FROM effects
 WHERE run_id = %(run_id)s AND mutation AND state NOT IN ('failed', 'not_sent_test')
 ORDER BY created_at, id;

-- name: effects_mutation_kept
-- Whether a run reserved an external change that is not known to have failed (reserved, settled or
-- ambiguous): such a run is not replace-safe and is never retried or replaced silently.
SELECT EXISTS (
    SELECT 1 FROM effects
     WHERE run_id = %(run_id)s AND mutation AND state IN ('reserved', 'settled', 'ambiguous')
) AS kept;
