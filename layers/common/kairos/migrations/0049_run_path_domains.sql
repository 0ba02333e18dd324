-- The run path's single-column checks become domains (server CPU a run). Every statement that writes
-- a table reads each of its CHECK constraints back from the stored node tree and plans and compiles it
-- again (ExecRelCheck, once per statement), and checks them all, whatever the statement assigns:
-- runs holds 29 and is written three times a run. A domain's check is read once per connection (the
-- type cache) and tested only where a value is assigned to a column of that type, so a claim that sets
-- state, fence, attempt and the lease pays for those four and nothing else.
--
-- The same invariants, the same columns and base types (a client sees the base type: a domain's
-- column is described by its base type's OID, and information_schema.columns.data_type names it): a
-- bad value is refused with SQLSTATE 23514 (check_violation) as before, naming the domain's check
-- (e.g. kairos_run_state_check) instead of the table's. The checks that relate two columns stay
-- table CHECKs under their names.
--
-- Done without rewriting a table: each domain is created bare, the columns take it (a bare domain over
-- the column's type is binary coercible: no rewrite, the plain indexes kept; indexes whose predicate
-- reads the column, and the column's statistics, are rebuilt: ANALYZE below), then the domain takes
-- its check, which reads the tables once to validate their rows. Views and triggers that read a
-- changed column are dropped and created again as they were.
--
-- Widening a domain's IN-list later: kairos_widen_domain('kairos_run_state', ARRAY['new']), or
-- kairos_widen_check('runs', 'state', ...) as before (it widens the column's domain when it has one).
-- The event types of kairos_event_batch: ALTER DOMAIN kairos_event_batch DROP CONSTRAINT
-- kairos_event_batch_check, then ADD it again with the longer list.

-- Dropped for the type changes, created again below.
DROP VIEW run_events;
DROP VIEW usage_ledger;
DROP VIEW usage_reservations;
DROP TRIGGER effects_settle_usage ON effects;
DROP TRIGGER runs_give_up_slot ON runs;
DROP TRIGGER runs_release_slot ON runs;

-- Generic domains.
CREATE DOMAIN kairos_owner AS text;
CREATE DOMAIN kairos_nonneg_int AS integer;
CREATE DOMAIN kairos_nonneg_bigint AS bigint;
CREATE DOMAIN kairos_nonneg_numeric AS numeric;
CREATE DOMAIN kairos_positive_int AS integer;
CREATE DOMAIN kairos_stripe AS smallint;
CREATE DOMAIN kairos_sha256_hex AS text;
-- The closed lists (kairos.states).
CREATE DOMAIN kairos_run_state AS text;
CREATE DOMAIN kairos_run_source AS text;
CREATE DOMAIN kairos_run_mode AS text;
CREATE DOMAIN kairos_flow_window AS text;
CREATE DOMAIN kairos_effect_kind AS text;
CREATE DOMAIN kairos_effect_state AS text;
CREATE DOMAIN kairos_step_kind AS text;
CREATE DOMAIN kairos_step_state AS text;
CREATE DOMAIN kairos_occurrence_decision AS text;
CREATE DOMAIN kairos_entry_role AS text;
CREATE DOMAIN kairos_fold AS smallint;
CREATE DOMAIN kairos_event_batch AS jsonb;

ALTER TABLE runs
    DROP CONSTRAINT runs_agent_digest_check,
    DROP CONSTRAINT runs_attempt_check,
    DROP CONSTRAINT runs_concurrency_limit_check,
    DROP CONSTRAINT runs_deliveries_check,
    DROP CONSTRAINT runs_fence_check,
    DROP CONSTRAINT runs_flow_window_check,
    DROP CONSTRAINT runs_last_seq_check,
    DROP CONSTRAINT runs_max_attempts_check,
    DROP CONSTRAINT runs_max_steps_check,
    DROP CONSTRAINT runs_mode_check,
    DROP CONSTRAINT runs_owner_check,
    DROP CONSTRAINT runs_restarts_check,
    DROP CONSTRAINT runs_runtime_limit_seconds_check,
    DROP CONSTRAINT runs_schedule_revision_check,
    DROP CONSTRAINT runs_slot_limit_check,
    DROP CONSTRAINT runs_source_check,
    DROP CONSTRAINT runs_state_check,
    DROP CONSTRAINT runs_unclaimed_handoffs_nonneg,
    ALTER COLUMN agent_digest TYPE kairos_sha256_hex,
    ALTER COLUMN attempt TYPE kairos_nonneg_int,
    ALTER COLUMN concurrency_limit TYPE kairos_positive_int,
    ALTER COLUMN deliveries TYPE kairos_positive_int,
    ALTER COLUMN fence TYPE kairos_nonneg_bigint,
    ALTER COLUMN flow_window TYPE kairos_flow_window,
    ALTER COLUMN last_seq TYPE kairos_nonneg_int,
    ALTER COLUMN max_attempts TYPE kairos_positive_int,
    ALTER COLUMN max_steps TYPE kairos_positive_int,
    ALTER COLUMN mode TYPE kairos_run_mode,
    ALTER COLUMN owner TYPE kairos_owner,
    ALTER COLUMN restarts TYPE kairos_nonneg_int,
    ALTER COLUMN runtime_limit_seconds TYPE kairos_positive_int,
    ALTER COLUMN schedule_revision TYPE kairos_positive_int,
    ALTER COLUMN slot_limit TYPE kairos_positive_int,
    ALTER COLUMN source TYPE kairos_run_source,
    ALTER COLUMN state TYPE kairos_run_state,
    ALTER COLUMN unclaimed_handoffs TYPE kairos_nonneg_int;

ALTER TABLE effects
    DROP CONSTRAINT effects_charge_cost_usd_check,
    DROP CONSTRAINT effects_charge_stripe_check,
    DROP CONSTRAINT effects_charge_tokens_check,
    DROP CONSTRAINT effects_kind_check,
    DROP CONSTRAINT effects_state_check,
    ALTER COLUMN charge_cost_usd TYPE kairos_nonneg_numeric,
    ALTER COLUMN charge_stripe TYPE kairos_stripe,
    ALTER COLUMN charge_tokens TYPE kairos_nonneg_bigint,
    ALTER COLUMN kind TYPE kairos_effect_kind,
    ALTER COLUMN state TYPE kairos_effect_state;

ALTER TABLE run_event_batches
    DROP CONSTRAINT run_event_batches_attempt_check,
    DROP CONSTRAINT run_event_batches_type_check,
    ALTER COLUMN attempt TYPE kairos_nonneg_int,
    ALTER COLUMN events TYPE kairos_event_batch;

ALTER TABLE usage_ledger_stripes
    DROP CONSTRAINT usage_ledger_calls_check,
    DROP CONSTRAINT usage_ledger_cost_usd_check,
    DROP CONSTRAINT usage_ledger_input_tokens_check,
    DROP CONSTRAINT usage_ledger_output_tokens_check,
    DROP CONSTRAINT usage_ledger_owner_check,
    DROP CONSTRAINT usage_ledger_reserved_cost_usd_check,
    DROP CONSTRAINT usage_ledger_reserved_tokens_check,
    DROP CONSTRAINT usage_ledger_runs_check,
    DROP CONSTRAINT usage_ledger_stripes_stripe_check,
    ALTER COLUMN calls TYPE kairos_nonneg_int,
    ALTER COLUMN cost_usd TYPE kairos_nonneg_numeric,
    ALTER COLUMN input_tokens TYPE kairos_nonneg_bigint,
    ALTER COLUMN output_tokens TYPE kairos_nonneg_bigint,
    ALTER COLUMN owner TYPE kairos_owner,
    ALTER COLUMN reserved_cost_usd TYPE kairos_nonneg_numeric,
    ALTER COLUMN reserved_tokens TYPE kairos_nonneg_bigint,
    ALTER COLUMN runs TYPE kairos_nonneg_int,
    ALTER COLUMN stripe TYPE kairos_stripe;

ALTER TABLE run_steps
    DROP CONSTRAINT run_steps_kind_check,
    DROP CONSTRAINT run_steps_n_check,
    DROP CONSTRAINT run_steps_state_check,
    ALTER COLUMN kind TYPE kairos_step_kind,
    ALTER COLUMN n TYPE kairos_positive_int,
    ALTER COLUMN state TYPE kairos_step_state;

ALTER TABLE occurrences
    DROP CONSTRAINT occurrences_covers_count_check,
    DROP CONSTRAINT occurrences_decision_check,
    DROP CONSTRAINT occurrences_fold_check,
    DROP CONSTRAINT occurrences_key_generation_check,
    DROP CONSTRAINT occurrences_source_check,
    ALTER COLUMN covers_count TYPE kairos_positive_int,
    ALTER COLUMN decision TYPE kairos_occurrence_decision,
    ALTER COLUMN fold TYPE kairos_fold,
    ALTER COLUMN key_generation TYPE kairos_nonneg_int,
    ALTER COLUMN source TYPE kairos_run_source;

ALTER TABLE conversation_entries
    DROP CONSTRAINT conversation_entries_role_check,
    DROP CONSTRAINT conversation_entries_seq_check,
    ALTER COLUMN role TYPE kairos_entry_role,
    ALTER COLUMN seq TYPE kairos_positive_int;

ALTER TABLE conversations
    DROP CONSTRAINT conversations_fork_seq_nonneg,
    DROP CONSTRAINT conversations_owner_check,
    ALTER COLUMN fork_seq TYPE kairos_nonneg_int,
    ALTER COLUMN owner TYPE kairos_owner;

-- The checks, each validated against the rows of every column of its domain.
ALTER DOMAIN kairos_owner ADD CONSTRAINT kairos_owner_check CHECK (VALUE <> '');
ALTER DOMAIN kairos_nonneg_int ADD CONSTRAINT kairos_nonneg_int_check CHECK (VALUE >= 0);
ALTER DOMAIN kairos_nonneg_bigint ADD CONSTRAINT kairos_nonneg_bigint_check CHECK (VALUE >= 0);
ALTER DOMAIN kairos_nonneg_numeric ADD CONSTRAINT kairos_nonneg_numeric_check CHECK (VALUE >= 0);
ALTER DOMAIN kairos_positive_int ADD CONSTRAINT kairos_positive_int_check CHECK (VALUE >= 1);
ALTER DOMAIN kairos_stripe ADD CONSTRAINT kairos_stripe_check CHECK (VALUE BETWEEN 0 AND 7);
ALTER DOMAIN kairos_sha256_hex ADD CONSTRAINT kairos_sha256_hex_check CHECK (VALUE ~ '^[0-9a-f]{64}$');
ALTER DOMAIN kairos_run_state ADD CONSTRAINT kairos_run_state_check CHECK (VALUE IN (
    'queued', 'running', 'awaiting_approval', 'awaiting_input', 'succeeded', 'failed', 'cancelled', 'expired',
    'abandoned', 'policy_blocked'));
ALTER DOMAIN kairos_run_source ADD CONSTRAINT kairos_run_source_check CHECK (VALUE IN (
    'backfill', 'chat', 'manual', 'scheduled', 'test', 'webhook'));
ALTER DOMAIN kairos_run_mode ADD CONSTRAINT kairos_run_mode_check CHECK (VALUE IN ('fork', 'append', 'fresh'));
ALTER DOMAIN kairos_flow_window ADD CONSTRAINT kairos_flow_window_check CHECK (VALUE IN ('debounce', 'batch'));
ALTER DOMAIN kairos_effect_kind ADD CONSTRAINT kairos_effect_kind_check CHECK (VALUE IN (
    'model_call', 'http_call', 'tool_call'));
ALTER DOMAIN kairos_effect_state ADD CONSTRAINT kairos_effect_state_check CHECK (VALUE IN (
    'ambiguous', 'failed', 'not_sent_test', 'reserved', 'settled'));
ALTER DOMAIN kairos_step_kind ADD CONSTRAINT kairos_step_kind_check CHECK (VALUE IN ('model', 'tool'));
ALTER DOMAIN kairos_step_state ADD CONSTRAINT kairos_step_state_check CHECK (VALUE IN (
    'running', 'succeeded', 'failed', 'ambiguous', 'waiting_approval', 'denied', 'not_sent_test'));
ALTER DOMAIN kairos_occurrence_decision ADD CONSTRAINT kairos_occurrence_decision_check CHECK (VALUE IN (
    'coalesced', 'dispatched', 'expired', 'queued_behind', 'skipped_budget', 'skipped_late', 'skipped_overlap',
    'skipped_paused'));
ALTER DOMAIN kairos_entry_role ADD CONSTRAINT kairos_entry_role_check CHECK (VALUE IN (
    'system', 'user', 'assistant', 'tool'));
ALTER DOMAIN kairos_fold ADD CONSTRAINT kairos_fold_check CHECK (VALUE IN (0, 1));
-- A non-empty array (run_event_batches_seq_check, a table check, relates it to last_seq) whose every
-- element has a type of the closed list: what run_event_batches_type_check held.
ALTER DOMAIN kairos_event_batch ADD CONSTRAINT kairos_event_batch_check CHECK (
    jsonb_typeof(VALUE) = 'array' AND jsonb_array_length(VALUE) >= 1
    AND jsonb_array_length(jsonb_path_query_array(VALUE, '$[*].type')) = jsonb_array_length(VALUE)
    AND jsonb_path_query_array(VALUE, '$[*].type') <@ '[
    "run.queued", "run.claimed", "step.started", "step.progress", "step.finished", "effect.reserved",
    "effect.settled", "output.published", "run.rescued", "run.cancel_requested", "run.deferred",
    "approval.waiting", "approval.approved", "approval.denied", "input.waiting", "input.answered",
    "corpus.phase", "corpus.partition", "run.paused", "run.resumed", "run.succeeded", "run.failed",
    "run.cancelled", "run.expired", "run.abandoned", "run.policy_blocked"]'::jsonb);

-- As they were.
CREATE VIEW run_events AS
SELECT b.run_id,
       (b.last_seq - jsonb_array_length(b.events) + x.ord)::integer AS seq,
       x.event ->> 'type' AS type,
       b.at,
       b.attempt,
       b.fence,
       x.event ->> 'step' AS step,
       coalesce(x.event -> 'data', '{}'::jsonb) AS data
  FROM run_event_batches b
 CROSS JOIN LATERAL jsonb_array_elements(b.events) WITH ORDINALITY AS x (event, ord);
COMMENT ON VIEW run_events IS
    'Each run''s append-only, gap-free trace, one row per event (stored as run_event_batches).';
ALTER VIEW run_events ALTER COLUMN at SET DEFAULT now();
ALTER VIEW run_events ALTER COLUMN fence SET DEFAULT 0;
ALTER VIEW run_events ALTER COLUMN data SET DEFAULT '{}'::jsonb;
CREATE TRIGGER run_events_insert INSTEAD OF INSERT ON run_events
    FOR EACH ROW EXECUTE FUNCTION kairos_run_events_insert();
CREATE TRIGGER run_events_immutable INSTEAD OF UPDATE ON run_events
    FOR EACH ROW EXECUTE FUNCTION kairos_refuse_update();
CREATE TRIGGER run_events_no_delete BEFORE DELETE ON run_events
    FOR EACH STATEMENT EXECUTE FUNCTION kairos_refuse_delete();
CREATE TRIGGER run_events_prune INSTEAD OF DELETE ON run_events
    FOR EACH ROW EXECUTE FUNCTION kairos_run_events_prune();

CREATE VIEW usage_ledger AS
SELECT owner, day,
       sum(reserved_tokens)::bigint AS reserved_tokens, sum(reserved_cost_usd) AS reserved_cost_usd,
       sum(input_tokens)::bigint AS input_tokens, sum(output_tokens)::bigint AS output_tokens,
       sum(cost_usd) AS cost_usd, sum(calls)::integer AS calls, sum(runs)::integer AS runs
  FROM usage_ledger_stripes
 GROUP BY owner, day;

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

CREATE CONSTRAINT TRIGGER effects_settle_usage AFTER UPDATE OF state ON effects
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN (OLD.state = 'reserved' AND NEW.state <> 'reserved')
    EXECUTE FUNCTION kairos_settle_usage();
CREATE TRIGGER runs_give_up_slot BEFORE UPDATE ON runs FOR EACH ROW
    WHEN (NEW.admitted_at IS NOT NULL AND (NEW.state NOT IN ('queued', 'running') OR NEW.paused_at IS NOT NULL))
    EXECUTE FUNCTION kairos_runs_give_up_slot();
CREATE TRIGGER runs_release_slot AFTER UPDATE ON runs FOR EACH ROW
    WHEN ((OLD.state = 'running' OR OLD.admitted_at IS NOT NULL)
          AND NOT (NEW.state = 'running' OR NEW.admitted_at IS NOT NULL))
    EXECUTE FUNCTION kairos_runs_release_slot();

-- Widens the IN-list check of a domain by the given values, keeping whatever values it allows now,
-- under the same name; the values end up in sorted order, as kairos_widen_check leaves them.
CREATE FUNCTION kairos_widen_domain(dom regtype, added text[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    con record;
    allowed text;
BEGIN
    SELECT c.conname, pg_get_constraintdef(c.oid) AS def INTO con
      FROM pg_constraint c
     WHERE c.contypid = dom AND c.contype = 'c' AND pg_get_constraintdef(c.oid) ~ '\mVALUE\M = ANY'
     LIMIT 1;
    IF con IS NULL THEN
        RAISE EXCEPTION 'no IN-list check constraint on domain %', dom;
    END IF;
    SELECT string_agg(quote_literal(v), ', ' ORDER BY v) INTO allowed
      FROM (SELECT (regexp_matches(con.def, '''([^'']+)''::text', 'g'))[1] AS v
            UNION SELECT unnest(added)) AS vals;  -- UNION: each value once
    EXECUTE format('ALTER DOMAIN %s DROP CONSTRAINT %I', dom, con.conname);
    EXECUTE format('ALTER DOMAIN %s ADD CONSTRAINT %I CHECK (VALUE = ANY (ARRAY[%s]))', dom, con.conname, allowed);
END;
$$;

-- Widens an IN-list check on table.column by the given values (see 0011); a column whose list is its
-- domain's (above) has its domain widened: every column of that domain takes the values.
CREATE OR REPLACE FUNCTION kairos_widen_check(tbl regclass, col text, added text[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    con record;
    allowed text;
    dom regtype;
BEGIN
    SELECT t.oid INTO dom
      FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
     WHERE a.attrelid = tbl AND a.attname = col AND t.typtype = 'd';
    IF dom IS NOT NULL THEN
        PERFORM kairos_widen_domain(dom, added);
        RETURN;
    END IF;
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

-- A changed column's statistics went with its old type (and autovacuum, counting no changed rows,
-- would not take them again soon): take them again (a sample, not a scan) on a table that had been
-- vacuumed or analyzed. One never yet analyzed (reltuples -1: a new database) is left so.
DO $$
DECLARE
    t record;
BEGIN
    FOR t IN SELECT * FROM (VALUES
        ('runs', 'agent_digest, attempt, concurrency_limit, deliveries, fence, flow_window, last_seq, max_attempts, '
                 'max_steps, mode, owner, restarts, runtime_limit_seconds, schedule_revision, slot_limit, source, '
                 'state, unclaimed_handoffs'),
        ('effects', 'charge_cost_usd, charge_stripe, charge_tokens, kind, state'),
        ('run_event_batches', 'attempt, events'),
        ('usage_ledger_stripes', 'calls, cost_usd, input_tokens, output_tokens, owner, reserved_cost_usd, '
                                 'reserved_tokens, runs, stripe'),
        ('run_steps', 'kind, n, state'),
        ('occurrences', 'covers_count, decision, fold, key_generation, source'),
        ('conversation_entries', 'role, seq'),
        ('conversations', 'fork_seq, owner')) AS v (tbl, cols)
    LOOP
        IF (SELECT c.reltuples >= 0 FROM pg_class c WHERE c.oid = t.tbl::regclass) THEN
            EXECUTE format('ANALYZE %I (%s)', t.tbl, t.cols);
        END IF;
    END LOOP;
END;
$$;
