-- Usage counted call for call (kairos.budgets): every settled effect carries its own call's usage,
-- and a run's usage is the sum of its settled effects, recomputed by each statement that moves the
-- run out of `running` — so what an attempt spent before it parked (an approval, a question), was
-- requeued (a retry, a corpus slice) or vanished (a rescue) is never lost, and the run's usage,
-- the owner's day and the ceilings all read the same rows.

-- A run's usage: each numeric key of its settled effects' usage summed (input_tokens, output_tokens,
-- cost_usd, calls, tool_calls, steps, duration_ms and the provider's own counts); NULL when none.
CREATE FUNCTION kairos_run_usage(run uuid) RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_object_agg(s.key, s.total)
      FROM (SELECT u.key, sum((u.value #>> '{}')::numeric) AS total
              FROM effects e CROSS JOIN LATERAL jsonb_each(e.usage) AS u(key, value)
             WHERE e.run_id = run AND e.state = 'settled' AND jsonb_typeof(e.usage) = 'object'
               AND jsonb_typeof(u.value) = 'number'
             GROUP BY u.key) AS s
$$;

-- The settlement trigger of 0011, with one change: a run counts toward its day's `runs` at its first
-- settled model call whatever that call's usage says (before, a first call settled without usage —
-- a tool loop's turn — kept the run from ever being counted).
CREATE OR REPLACE FUNCTION kairos_settle_usage() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    res usage_reservations%ROWTYPE;
    used_in bigint := 0;
    used_out bigint := 0;
    used_cost numeric := 0;
    first_of_day boolean := false;
BEGIN
    SELECT * INTO res FROM usage_reservations WHERE effect_id = NEW.id AND settled_at IS NULL FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF NEW.state = 'settled' THEN
        IF NEW.usage IS NOT NULL THEN
            used_in := greatest(coalesce((NEW.usage ->> 'input_tokens')::bigint, 0), 0);
            used_out := greatest(coalesce((NEW.usage ->> 'output_tokens')::bigint, 0), 0);
            used_cost := greatest(coalesce((NEW.usage ->> 'cost_usd')::numeric, 0), 0);
        END IF;
        first_of_day := NOT EXISTS (
            SELECT 1 FROM usage_reservations o
             WHERE o.run_id = res.run_id AND o.day = res.day AND o.effect_id <> res.effect_id
               AND o.settled_at IS NOT NULL AND o.input_tokens IS NOT NULL);
    END IF;
    UPDATE usage_reservations
       SET settled_at = coalesce(NEW.settled_at, now()),
           input_tokens = CASE WHEN NEW.state = 'settled' THEN used_in END,
           output_tokens = CASE WHEN NEW.state = 'settled' THEN used_out END,
           used_cost_usd = CASE WHEN NEW.state = 'settled' THEN used_cost END
     WHERE effect_id = res.effect_id;
    UPDATE usage_ledger
       SET reserved_tokens = greatest(reserved_tokens - res.tokens, 0),
           reserved_cost_usd = greatest(reserved_cost_usd - res.cost_usd, 0),
           input_tokens = input_tokens + used_in,
           output_tokens = output_tokens + used_out,
           cost_usd = cost_usd + used_cost,
           calls = calls + CASE WHEN NEW.state = 'settled' THEN 1 ELSE 0 END,
           runs = runs + CASE WHEN first_of_day THEN 1 ELSE 0 END
     WHERE owner = res.owner AND day = res.day;
    RETURN NULL;
END;
$$;
