-- An owner's day of the budget ledger in 8 stripe rows instead of one (kairos.budgets), so that runs of
-- one owner do not queue on one row: a reservation (before the model call) and a settlement (at the
-- commit that closes the call's effect) each hold their row's lock to their commit, and with one row
-- per owner-day every run of a busy owner waited there twice, behind every other run's commit.
--
-- The table keeps its rows as usage_ledger_stripes, keyed (owner, day, stripe); `usage_ledger` is now a
-- view summing an owner-day's stripes, with the columns and types it had, so every reader (GET
-- /v1/usage, the chaos invariants, the schema's users) sees what it saw.
--
-- The ceiling stays exact by escrow: each stripe holds an allowance (tokens and US dollars), the
-- allowances of an owner-day sum to the ceiling they were last shared out for (ceiling_*, recorded on
-- every stripe), and a reservation takes a stripe only while that stripe's reserved + used + estimate
-- stays within its own allowance, so the day's total stays within the sum. A reservation
-- (kairos_usage_reserve) first takes, without waiting (SKIP LOCKED), a stripe with room — the run's own
-- stripe (by its id) first —, then waits on its own stripe; when none has room, or the ceiling it is
-- given differs from the one the allowances were shared for (a changed setting), or a stripe is in
-- deficit (a settled call used more than its estimate), it locks every stripe of the owner-day in
-- stripe order, decides on the exact total and shares out what is left again. So a refusal is only ever
-- decided on the exact total, under all stripes' locks; a grant on one stripe never needs the others.
-- The settlement charges the stripe its effect's reservation was booked on (effects.charge_stripe).
--
-- Lock order (kairos.budgets): a run row, then an owner's slot lock, then stripes in stripe order. A
-- reservation or a settlement holds one stripe, the slow path all of them taken in order, and nothing
-- takes a run row or a slot lock while holding a stripe.

ALTER TABLE usage_ledger RENAME TO usage_ledger_stripes;
ALTER TABLE usage_ledger_stripes RENAME CONSTRAINT usage_ledger_pkey TO usage_ledger_stripes_pkey;
ALTER TABLE usage_ledger_stripes
    ADD COLUMN stripe smallint NOT NULL DEFAULT 0 CHECK (stripe BETWEEN 0 AND 7),
    -- what this stripe may hold (reserved + used) of the ceiling_* it was last shared out for; NULL
    -- until the owner-day is first shared out (a day from before this migration: its slow path does it)
    ADD COLUMN allowance_tokens bigint,
    ADD COLUMN allowance_cost_usd numeric,
    ADD COLUMN ceiling_tokens bigint,
    ADD COLUMN ceiling_cost_usd numeric,
    DROP CONSTRAINT usage_ledger_stripes_pkey,
    ADD CONSTRAINT usage_ledger_stripes_pkey PRIMARY KEY (owner, day, stripe);
-- Room on each page for a stripe's next version (its updates change no indexed column: HOT).
ALTER TABLE usage_ledger_stripes SET (fillfactor = 50);

CREATE VIEW usage_ledger AS
SELECT owner, day,
       sum(reserved_tokens)::bigint AS reserved_tokens, sum(reserved_cost_usd) AS reserved_cost_usd,
       sum(input_tokens)::bigint AS input_tokens, sum(output_tokens)::bigint AS output_tokens,
       sum(cost_usd) AS cost_usd, sum(calls)::integer AS calls, sum(runs)::integer AS runs
  FROM usage_ledger_stripes
 GROUP BY owner, day;

-- The stripe a model call's reservation was booked on (NULL: a reservation from before the stripes, on
-- the owner-day's only row, stripe 0).
ALTER TABLE effects ADD COLUMN charge_stripe smallint CHECK (charge_stripe BETWEEN 0 AND 7);

-- Books `tokens` and `cost` for a call of `owner` on `day` against the ceilings `max_tokens` and
-- `max_cost` (reserved + used + this estimate never above either); the stripe booked, or NULL when the
-- owner-day's exact total has no room (nothing booked). `hint` (0-7) is the stripe tried first.
CREATE FUNCTION kairos_usage_reserve(p_owner text, p_day date, p_tokens bigint, p_cost numeric,
                                     p_max_tokens bigint, p_max_cost numeric, p_hint integer)
RETURNS smallint
LANGUAGE plpgsql AS $$
DECLARE
    n CONSTANT integer := 8;
    got smallint;
    have integer;
    total_tokens numeric;
    total_cost numeric;
    free_tokens bigint;
    free_cost numeric;
    share_tokens bigint;
    share_cost numeric;
BEGIN
    IF p_tokens > p_max_tokens OR p_cost > p_max_cost THEN
        RETURN NULL;
    END IF;
    -- Each try below is a block of its own (a subtransaction) undone when it books nothing: a stripe
    -- whose row changed under the statement is locked before its conditions are checked again, and
    -- stays locked if they fail; undoing the block lets go of it, so nothing goes on to wait for a
    -- stripe (the hinted one, or every one in order) while holding another out of order (a deadlock).
    --
    -- Fast path: a stripe with room within its allowance, shared out for these ceilings, while no
    -- stripe of the day is in deficit; one not locked by anyone else, the hinted stripe first.
    BEGIN
        UPDATE usage_ledger_stripes l
           SET reserved_tokens = l.reserved_tokens + p_tokens, reserved_cost_usd = l.reserved_cost_usd + p_cost
         WHERE (l.owner, l.day, l.stripe) = (
                SELECT s.owner, s.day, s.stripe FROM usage_ledger_stripes s
                 WHERE s.owner = p_owner AND s.day = p_day
                   AND s.ceiling_tokens = p_max_tokens AND s.ceiling_cost_usd = p_max_cost
                   AND s.reserved_tokens + s.input_tokens + s.output_tokens + p_tokens <= s.allowance_tokens
                   AND s.reserved_cost_usd + s.cost_usd + p_cost <= s.allowance_cost_usd
                   AND NOT EXISTS (
                       SELECT 1 FROM usage_ledger_stripes d
                        WHERE d.owner = p_owner AND d.day = p_day
                          AND (d.allowance_tokens IS NULL
                               OR d.reserved_tokens + d.input_tokens + d.output_tokens > d.allowance_tokens
                               OR d.reserved_cost_usd + d.cost_usd > d.allowance_cost_usd))
                 ORDER BY (s.stripe - p_hint + n) % n
                 LIMIT 1
                   FOR NO KEY UPDATE SKIP LOCKED)
        RETURNING l.stripe INTO got;
        IF got IS NULL THEN
            RAISE SQLSTATE 'KZ001';
        END IF;
        RETURN got;
    EXCEPTION WHEN SQLSTATE 'KZ001' THEN
        NULL;
    END;
    -- Every stripe with room was locked by others: wait for the hinted one, and book there if it has
    -- room once its holder committed (the conditions are checked again on the row as it is then).
    BEGIN
        UPDATE usage_ledger_stripes l
           SET reserved_tokens = l.reserved_tokens + p_tokens, reserved_cost_usd = l.reserved_cost_usd + p_cost
         WHERE l.owner = p_owner AND l.day = p_day AND l.stripe = p_hint
           AND l.ceiling_tokens = p_max_tokens AND l.ceiling_cost_usd = p_max_cost
           AND l.reserved_tokens + l.input_tokens + l.output_tokens + p_tokens <= l.allowance_tokens
           AND l.reserved_cost_usd + l.cost_usd + p_cost <= l.allowance_cost_usd
           AND NOT EXISTS (
               SELECT 1 FROM usage_ledger_stripes d
                WHERE d.owner = p_owner AND d.day = p_day
                  AND (d.allowance_tokens IS NULL
                       OR d.reserved_tokens + d.input_tokens + d.output_tokens > d.allowance_tokens
                       OR d.reserved_cost_usd + d.cost_usd > d.allowance_cost_usd))
        RETURNING l.stripe INTO got;
        IF got IS NULL THEN
            RAISE SQLSTATE 'KZ001';
        END IF;
        RETURN got;
    EXCEPTION WHEN SQLSTATE 'KZ001' THEN
        NULL;
    END;
    -- Slow path: every stripe of the owner-day, locked in stripe order (created first if missing: an
    -- insert that finds a row takes no lock on it), the exact total, and what is left shared out again
    -- (the hinted stripe books the call and keeps the remainder of the division).
    SELECT count(*) INTO have FROM usage_ledger_stripes WHERE owner = p_owner AND day = p_day;
    IF have < n THEN
        INSERT INTO usage_ledger_stripes (owner, day, stripe)
        SELECT p_owner, p_day, s FROM generate_series(0, n - 1) AS s
            ON CONFLICT DO NOTHING;
    END IF;
    PERFORM 1 FROM usage_ledger_stripes WHERE owner = p_owner AND day = p_day ORDER BY stripe FOR NO KEY UPDATE;
    SELECT sum(reserved_tokens + input_tokens + output_tokens), sum(reserved_cost_usd + cost_usd)
      INTO total_tokens, total_cost
      FROM usage_ledger_stripes WHERE owner = p_owner AND day = p_day;
    IF total_tokens + p_tokens > p_max_tokens OR total_cost + p_cost > p_max_cost THEN
        RETURN NULL;
    END IF;
    got := p_hint;
    free_tokens := p_max_tokens - total_tokens - p_tokens;
    free_cost := p_max_cost - total_cost - p_cost;
    share_tokens := free_tokens / n;
    share_cost := trunc(free_cost / n, 9);
    UPDATE usage_ledger_stripes l
       SET reserved_tokens = l.reserved_tokens + CASE WHEN l.stripe = got THEN p_tokens ELSE 0 END,
           reserved_cost_usd = l.reserved_cost_usd + CASE WHEN l.stripe = got THEN p_cost ELSE 0 END,
           allowance_tokens = l.reserved_tokens + l.input_tokens + l.output_tokens
                              + CASE WHEN l.stripe = got THEN p_tokens + free_tokens - share_tokens * (n - 1)
                                     ELSE share_tokens END,
           allowance_cost_usd = l.reserved_cost_usd + l.cost_usd
                                + CASE WHEN l.stripe = got THEN p_cost + free_cost - share_cost * (n - 1)
                                       ELSE share_cost END,
           ceiling_tokens = p_max_tokens,
           ceiling_cost_usd = p_max_cost
     WHERE l.owner = p_owner AND l.day = p_day;
    RETURN got;
END;
$$;

-- The settlement (migrations 0011, 0031, 0033) on the stripe the reservation was booked on.
CREATE OR REPLACE FUNCTION kairos_settle_usage() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    used_in bigint := 0;
    used_out bigint := 0;
    used_cost numeric := 0;
    first_of_day boolean := false;
BEGIN
    IF NEW.charge_day IS NULL THEN
        RETURN NULL;
    END IF;
    IF NEW.state = 'settled' THEN
        IF NEW.usage IS NOT NULL THEN
            used_in := greatest(coalesce((NEW.usage ->> 'input_tokens')::bigint, 0), 0);
            used_out := greatest(coalesce((NEW.usage ->> 'output_tokens')::bigint, 0), 0);
            used_cost := greatest(coalesce((NEW.usage ->> 'cost_usd')::numeric, 0), 0);
        END IF;
        first_of_day := NOT EXISTS (
            SELECT 1 FROM effects o
             WHERE o.run_id = NEW.run_id AND o.charge_day = NEW.charge_day AND o.id <> NEW.id
               AND o.state = 'settled' AND (o.settled_at, o.id) < (NEW.settled_at, NEW.id));
    END IF;
    UPDATE usage_ledger_stripes l
       SET reserved_tokens = greatest(l.reserved_tokens - NEW.charge_tokens, 0),
           reserved_cost_usd = greatest(l.reserved_cost_usd - NEW.charge_cost_usd, 0),
           input_tokens = l.input_tokens + used_in,
           output_tokens = l.output_tokens + used_out,
           cost_usd = l.cost_usd + used_cost,
           calls = l.calls + CASE WHEN NEW.state = 'settled' THEN 1 ELSE 0 END,
           runs = l.runs + CASE WHEN first_of_day THEN 1 ELSE 0 END
      FROM runs r
     WHERE r.id = NEW.run_id AND l.owner = r.owner AND l.day = NEW.charge_day
       AND l.stripe = coalesce(NEW.charge_stripe, 0);
    RETURN NULL;
END;
$$;
