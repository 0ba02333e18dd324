-- A model call's budget reservation is kept on its effect row (kairos.budgets): the effect already
-- says which run reserved it, when it closed and what it used, so a second row per call (inserted with
-- the effect, updated at its settlement, with its own two indexes and three foreign-key checks) only
-- repeated it. The reservation is three columns of the effect now: the UTC day it was charged to and
-- the estimate charged (tokens, US dollars). `usage_reservations` stays as a view with the columns it
-- had (the owner is the run's; what a settled call used is its effect's usage), so readers see the
-- same rows. The ceiling is unchanged: a reservation is still charged by one guarded upsert on the
-- owner's day row of usage_ledger, in the statement that inserts the effect.

ALTER TABLE effects
    ADD COLUMN charge_day date,
    ADD COLUMN charge_tokens bigint CHECK (charge_tokens >= 0),
    ADD COLUMN charge_cost_usd numeric CHECK (charge_cost_usd >= 0),
    ADD CONSTRAINT effects_charge_whole CHECK ((charge_day IS NULL) = (charge_tokens IS NULL)
                                               AND (charge_day IS NULL) = (charge_cost_usd IS NULL));

UPDATE effects e
   SET charge_day = u.day, charge_tokens = u.tokens, charge_cost_usd = u.cost_usd
  FROM usage_reservations u
 WHERE u.effect_id = e.id;

-- The settlement (a deferred trigger on effects, migration 0031), reading the charge from the effect
-- itself. It fires once per effect (its move out of `reserved`), so the reservation needs no row lock
-- of its own. A run counts toward its day's `runs` at its first settled model call of the day: the
-- first by (settled_at, id), so two calls settled in one transaction count it once.
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
    UPDATE usage_ledger l
       SET reserved_tokens = greatest(l.reserved_tokens - NEW.charge_tokens, 0),
           reserved_cost_usd = greatest(l.reserved_cost_usd - NEW.charge_cost_usd, 0),
           input_tokens = l.input_tokens + used_in,
           output_tokens = l.output_tokens + used_out,
           cost_usd = l.cost_usd + used_cost,
           calls = l.calls + CASE WHEN NEW.state = 'settled' THEN 1 ELSE 0 END,
           runs = l.runs + CASE WHEN first_of_day THEN 1 ELSE 0 END
      FROM runs r
     WHERE r.id = NEW.run_id AND l.owner = r.owner AND l.day = NEW.charge_day;
    RETURN NULL;
END;
$$;

DROP TABLE usage_reservations;

-- One row per model-call effect that was charged: the estimate held against the owner's day until
-- the effect closed (settled_at), then what the call used (settled) or nothing (failed, ambiguous).
CREATE VIEW usage_reservations AS
SELECT e.id AS effect_id, e.run_id, r.owner, e.charge_day AS day, e.charge_tokens AS tokens,
       e.charge_cost_usd AS cost_usd,
       CASE WHEN e.state = 'settled' THEN greatest(coalesce((e.usage ->> 'input_tokens')::bigint, 0), 0) END
           AS input_tokens,
       CASE WHEN e.state = 'settled' THEN greatest(coalesce((e.usage ->> 'output_tokens')::bigint, 0), 0) END
           AS output_tokens,
       CASE WHEN e.state = 'settled' THEN greatest(coalesce((e.usage ->> 'cost_usd')::numeric, 0), 0) END
           AS used_cost_usd,
       e.settled_at
  FROM effects e
  JOIN runs r ON r.id = e.run_id
 WHERE e.charge_day IS NOT NULL;
