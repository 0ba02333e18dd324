-- usage_ledger: each owner's model usage per UTC day, and what calls in flight have reserved of it
-- (kairos.budgets): the table usage_ledger_stripes, 8 rows per owner-day, and the view usage_ledger
-- summing them (migration 0041). A reservation is its model-call effect's charge_* columns (migration
-- 0033; the view usage_reservations shows them), booked on a stripe by kairos_usage_reserve in the
-- worker's effect transaction; their settlement is the trigger on effects (migrations 0011, 0031,
-- 0033, 0041) on the stripe booked (charge_stripe).

-- name: usage_ledger_reserve (prepared)
-- Charges one call's estimate to the owner's day, only while reserved + used + this estimate stays
-- within both ceilings (kairos_usage_reserve: a stripe with room within its allowance without waiting,
-- else the exact total under every stripe's lock). Zero rows: no room (nothing charged). The effect
-- (reserved in this transaction, before) records the charge and its stripe.
WITH want AS (
    SELECT %(owner)s::text AS owner, (coalesce(%(now)s::timestamptz, now()) AT TIME ZONE 'UTC')::date AS day,
           %(tokens)s::bigint AS tokens, %(cost_usd)s::numeric AS cost_usd
      FROM effects e
     WHERE e.id = %(effect_id)s AND e.run_id = %(run_id)s AND e.state = 'reserved' AND e.charge_day IS NULL
), booked AS (
    SELECT w.owner, w.day, w.tokens, w.cost_usd,
           kairos_usage_reserve(w.owner, w.day, w.tokens, w.cost_usd, %(max_tokens)s::bigint,
                                %(max_cost_usd)s::numeric, %(stripe_first)s::integer) AS stripe
      FROM want w
), held AS (
    UPDATE effects e
       SET charge_day = b.day, charge_tokens = b.tokens, charge_cost_usd = b.cost_usd, charge_stripe = b.stripe
      FROM booked b
     WHERE e.id = %(effect_id)s AND e.run_id = %(run_id)s AND b.stripe IS NOT NULL
)
SELECT owner, day FROM booked WHERE stripe IS NOT NULL;

-- name: usage_ledger_lock_charged
-- Locks the stripes the settlements of these (closed) effects charge at the commit, in (owner, day,
-- stripe) order — the slow path's order — rather than the order the effects closed in: the tick's
-- rescue runs it as its last lock (kairos.budgets, Lock order). Rows are locked as the sort emits them.
SELECT l.stripe
  FROM usage_ledger_stripes l
  JOIN (SELECT DISTINCT r.owner, e.charge_day, coalesce(e.charge_stripe, 0) AS stripe
          FROM effects e
          JOIN runs r ON r.id = e.run_id
         WHERE e.id = ANY(%(effect_ids)s::uuid[]) AND e.charge_day IS NOT NULL) AS c
    ON l.owner = c.owner AND l.day = c.charge_day AND l.stripe = c.stripe
 ORDER BY l.owner, l.day, l.stripe
   FOR NO KEY UPDATE OF l;

-- name: usage_ledger_days
-- One owner's usage for each UTC day in [from, until), days without usage as zeros.
SELECT d.day::date AS day, coalesce(l.input_tokens, 0) AS input_tokens, coalesce(l.output_tokens, 0) AS output_tokens,
       coalesce(l.cost_usd, 0) AS cost_usd, coalesce(l.calls, 0) AS calls, coalesce(l.runs, 0) AS runs
  FROM generate_series(%(from)s::date, %(until)s::date - 1, interval '1 day') AS d(day)
  LEFT JOIN usage_ledger l ON l.owner = %(owner)s AND l.day = d.day::date  -- the view: the stripes summed
 ORDER BY d.day;

-- name: usage_ledger_today
-- The UTC date of now (the database's clock unless a test moves it).
SELECT (coalesce(%(now)s::timestamptz, now()) AT TIME ZONE 'UTC')::date AS today;
