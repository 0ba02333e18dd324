-- usage_ledger: each owner's model usage per UTC day, and what calls in flight have reserved of it
-- (kairos.budgets). A reservation is its model-call effect's charge_* columns (migration 0033; the view
-- usage_reservations shows them), written here in the worker's effect transaction; their settlement is
-- the trigger on effects (migrations 0011, 0031, 0033).

-- name: usage_ledger_reserve (prepared)
-- Charges one call's estimate to the owner's day, only while reserved + used + this estimate stays
-- within both ceilings: one guarded upsert, so concurrent reservations of the owner serialize on the
-- ledger row and the last one that fits wins. Zero rows: no room (nothing charged). The effect
-- (reserved in this transaction, before) records the charge.
WITH want AS (
    SELECT %(owner)s::text AS owner, (coalesce(%(now)s::timestamptz, now()) AT TIME ZONE 'UTC')::date AS day,
           %(tokens)s::bigint AS tokens, %(cost_usd)s::numeric AS cost_usd
), booked AS (
    INSERT INTO usage_ledger AS l (owner, day, reserved_tokens, reserved_cost_usd)
    SELECT owner, day, tokens, cost_usd FROM want
     WHERE tokens <= %(max_tokens)s::bigint AND cost_usd <= %(max_cost_usd)s::numeric
       AND EXISTS (SELECT 1 FROM effects e WHERE e.id = %(effect_id)s AND e.run_id = %(run_id)s
                                             AND e.state = 'reserved' AND e.charge_day IS NULL)
        ON CONFLICT (owner, day) DO UPDATE
       SET reserved_tokens = l.reserved_tokens + EXCLUDED.reserved_tokens,
           reserved_cost_usd = l.reserved_cost_usd + EXCLUDED.reserved_cost_usd
     WHERE l.reserved_tokens + l.input_tokens + l.output_tokens + EXCLUDED.reserved_tokens <= %(max_tokens)s::bigint
       AND l.reserved_cost_usd + l.cost_usd + EXCLUDED.reserved_cost_usd <= %(max_cost_usd)s::numeric
    RETURNING l.owner, l.day
), held AS (
    UPDATE effects e
       SET charge_day = b.day, charge_tokens = w.tokens, charge_cost_usd = w.cost_usd
      FROM booked b CROSS JOIN want w
     WHERE e.id = %(effect_id)s AND e.run_id = %(run_id)s
)
SELECT owner, day FROM booked;

-- name: usage_ledger_days
-- One owner's usage for each UTC day in [from, until), days without usage as zeros.
SELECT d.day::date AS day, coalesce(l.input_tokens, 0) AS input_tokens, coalesce(l.output_tokens, 0) AS output_tokens,
       coalesce(l.cost_usd, 0) AS cost_usd, coalesce(l.calls, 0) AS calls, coalesce(l.runs, 0) AS runs
  FROM generate_series(%(from)s::date, %(until)s::date - 1, interval '1 day') AS d(day)
  LEFT JOIN usage_ledger l ON l.owner = %(owner)s AND l.day = d.day::date
 ORDER BY d.day;

-- name: usage_ledger_today
-- The UTC date of now (the database's clock unless a test moves it).
SELECT (coalesce(%(now)s::timestamptz, now()) AT TIME ZONE 'UTC')::date AS today;
