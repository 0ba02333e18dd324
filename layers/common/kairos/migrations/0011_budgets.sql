-- Per-owner budgets (kairos.budgets): running slots,
-- the queued-run cap at fire time, and the daily token and cost ceilings with their ledger.

-- Widens an IN-list check constraint on table.column by the given values, keeping whatever values it
-- allows now (other migrations may have widened it too, in any order), under the same name.
CREATE FUNCTION kairos_widen_check(tbl regclass, col text, added text[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    con record;
    allowed text;
BEGIN
    SELECT c.conname, pg_get_constraintdef(c.oid) AS def INTO con
      FROM pg_constraint c
     WHERE c.conrelid = tbl AND c.contype = 'c'
       AND pg_get_constraintdef(c.oid) ~ ('\m' || col || '\M.*= ANY')
     LIMIT 1;
    IF con IS NULL THEN
        RAISE EXCEPTION 'no IN-list check constraint on %.%', tbl, col;
    END IF;
    SELECT string_agg(quote_literal(v), ', ' ORDER BY v) INTO allowed
      FROM (SELECT (regexp_matches(con.def, '''([^'']+)''::text', 'g'))[1] AS v
            UNION SELECT unnest(added)) AS vals;  -- UNION: each value once
    EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', tbl, con.conname);
    EXECUTE format('ALTER TABLE %s ADD CONSTRAINT %I CHECK (%I = ANY (ARRAY[%s]))',
                   tbl, con.conname, col, allowed);
END;
$$;

-- run.deferred: a claim found the owner's running slots full (appended at most once a minute).
SELECT kairos_widen_check('run_events', 'type', ARRAY['run.deferred']);
-- skipped_budget: the tick fired while the owner's queue was full; no run was made.
SELECT kairos_widen_check('occurrences', 'decision', ARRAY['skipped_budget']);

-- When the run's last run.deferred was appended (the once-a-minute bound), NULL before any.
ALTER TABLE runs ADD COLUMN deferred_at timestamptz;

-- The slot count at each claim and the queue count at each fire: the owner's running and queued runs.
CREATE INDEX runs_owner_active_idx ON runs (owner, state) WHERE state IN ('queued', 'running');

-- One row per owner and UTC day: what is reserved for calls in flight, and what settled calls used.
-- A reservation adds to reserved_*; the settlement of its effect (the trigger below) takes it back
-- out and adds the actual usage. The ceiling holds reserved + used.
CREATE TABLE usage_ledger (
    owner             text NOT NULL CHECK (owner <> ''),
    day               date NOT NULL,
    reserved_tokens   bigint NOT NULL DEFAULT 0 CHECK (reserved_tokens >= 0),
    reserved_cost_usd numeric NOT NULL DEFAULT 0 CHECK (reserved_cost_usd >= 0),
    input_tokens      bigint NOT NULL DEFAULT 0 CHECK (input_tokens >= 0),
    output_tokens     bigint NOT NULL DEFAULT 0 CHECK (output_tokens >= 0),
    cost_usd          numeric NOT NULL DEFAULT 0 CHECK (cost_usd >= 0),
    calls             integer NOT NULL DEFAULT 0 CHECK (calls >= 0),
    runs              integer NOT NULL DEFAULT 0 CHECK (runs >= 0),
    PRIMARY KEY (owner, day)
);

-- One reservation per model-call effect: the estimate charged against the owner's day until the
-- effect is closed, then what the call actually used (settled) or nothing (failed, ambiguous).
CREATE TABLE usage_reservations (
    effect_id     uuid PRIMARY KEY REFERENCES effects (id),
    run_id        uuid NOT NULL REFERENCES runs (id),
    owner         text NOT NULL,
    day           date NOT NULL,
    tokens        bigint NOT NULL CHECK (tokens >= 0),
    cost_usd      numeric NOT NULL CHECK (cost_usd >= 0),
    input_tokens  bigint,
    output_tokens bigint,
    used_cost_usd numeric,
    settled_at    timestamptz,
    FOREIGN KEY (owner, day) REFERENCES usage_ledger (owner, day)
);
CREATE INDEX usage_reservations_run_idx ON usage_reservations (run_id, day);

-- Settlement follows the effect wherever it is closed — by its worker (settled, failed, ambiguous),
-- by a new claim (close_stale) or by the tick's rescue (close_vanished) — in the same transaction, so
-- no closing path can forget to give a reservation back. A settled effect charges the usage it
-- records (input_tokens, output_tokens, cost_usd, set by the worker from the reply and the prices);
-- any other end charges nothing. runs counts each run once per day, at its first settled call.
CREATE FUNCTION kairos_settle_usage() RETURNS trigger
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
    IF NEW.state = 'settled' AND NEW.usage IS NOT NULL THEN
        used_in := greatest(coalesce((NEW.usage ->> 'input_tokens')::bigint, 0), 0);
        used_out := greatest(coalesce((NEW.usage ->> 'output_tokens')::bigint, 0), 0);
        used_cost := greatest(coalesce((NEW.usage ->> 'cost_usd')::numeric, 0), 0);
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

CREATE TRIGGER effects_settle_usage AFTER UPDATE OF state ON effects
    FOR EACH ROW WHEN (OLD.state = 'reserved' AND NEW.state <> 'reserved')
    EXECUTE FUNCTION kairos_settle_usage();
