-- The current Kairos schema: pg_dump --schema-only of a database the migrations in
-- layers/common/kairos/migrations/ built, normalised (kairos.local.schema). Generated: do not edit;
-- regenerate with ./scripts/schema. tests/db/test_schema_file.py holds it equal to the migrations.
-- pg_dump major version: 18

CREATE DOMAIN public.kairos_effect_kind AS text
	CONSTRAINT kairos_effect_kind_check CHECK ((VALUE = ANY (ARRAY['model_call'::text, 'http_call'::text, 'tool_call'::text])));

CREATE DOMAIN public.kairos_effect_state AS text
	CONSTRAINT kairos_effect_state_check CHECK ((VALUE = ANY (ARRAY['ambiguous'::text, 'failed'::text, 'not_sent_test'::text, 'reserved'::text, 'settled'::text])));

CREATE DOMAIN public.kairos_entry_role AS text
	CONSTRAINT kairos_entry_role_check CHECK ((VALUE = ANY (ARRAY['system'::text, 'user'::text, 'assistant'::text, 'tool'::text])));

CREATE DOMAIN public.kairos_event_batch AS jsonb
	CONSTRAINT kairos_event_batch_check CHECK (((jsonb_typeof(VALUE) = 'array'::text) AND (jsonb_array_length(VALUE) >= 1) AND (jsonb_array_length(jsonb_path_query_array(VALUE, '$[*]."type"'::jsonpath)) = jsonb_array_length(VALUE)) AND (jsonb_path_query_array(VALUE, '$[*]."type"'::jsonpath) <@ '["run.queued", "run.claimed", "step.started", "step.progress", "step.finished", "effect.reserved", "effect.settled", "output.published", "run.rescued", "run.cancel_requested", "run.deferred", "approval.waiting", "approval.approved", "approval.denied", "input.waiting", "input.answered", "corpus.phase", "corpus.partition", "run.paused", "run.resumed", "run.succeeded", "run.failed", "run.cancelled", "run.expired", "run.abandoned", "run.policy_blocked"]'::jsonb)));

CREATE DOMAIN public.kairos_flow_window AS text
	CONSTRAINT kairos_flow_window_check CHECK ((VALUE = ANY (ARRAY['debounce'::text, 'batch'::text])));

CREATE DOMAIN public.kairos_fold AS smallint
	CONSTRAINT kairos_fold_check CHECK ((VALUE = ANY (ARRAY[0, 1])));

CREATE DOMAIN public.kairos_nonneg_bigint AS bigint
	CONSTRAINT kairos_nonneg_bigint_check CHECK ((VALUE >= 0));

CREATE DOMAIN public.kairos_nonneg_int AS integer
	CONSTRAINT kairos_nonneg_int_check CHECK ((VALUE >= 0));

CREATE DOMAIN public.kairos_nonneg_numeric AS numeric
	CONSTRAINT kairos_nonneg_numeric_check CHECK ((VALUE >= (0)::numeric));

CREATE DOMAIN public.kairos_occurrence_decision AS text
	CONSTRAINT kairos_occurrence_decision_check CHECK ((VALUE = ANY (ARRAY['coalesced'::text, 'dispatched'::text, 'expired'::text, 'queued_behind'::text, 'skipped_budget'::text, 'skipped_late'::text, 'skipped_overlap'::text, 'skipped_paused'::text])));

CREATE DOMAIN public.kairos_owner AS text
	CONSTRAINT kairos_owner_check CHECK ((VALUE <> ''::text));

CREATE DOMAIN public.kairos_positive_int AS integer
	CONSTRAINT kairos_positive_int_check CHECK ((VALUE >= 1));

CREATE DOMAIN public.kairos_run_mode AS text
	CONSTRAINT kairos_run_mode_check CHECK ((VALUE = ANY (ARRAY['fork'::text, 'append'::text, 'fresh'::text])));

CREATE DOMAIN public.kairos_run_source AS text
	CONSTRAINT kairos_run_source_check CHECK ((VALUE = ANY (ARRAY['backfill'::text, 'chat'::text, 'manual'::text, 'scheduled'::text, 'test'::text, 'webhook'::text])));

CREATE DOMAIN public.kairos_run_state AS text
	CONSTRAINT kairos_run_state_check CHECK ((VALUE = ANY (ARRAY['queued'::text, 'running'::text, 'awaiting_approval'::text, 'awaiting_input'::text, 'succeeded'::text, 'failed'::text, 'cancelled'::text, 'expired'::text, 'abandoned'::text, 'policy_blocked'::text])));

CREATE DOMAIN public.kairos_sha256_hex AS text
	CONSTRAINT kairos_sha256_hex_check CHECK ((VALUE ~ '^[0-9a-f]{64}$'::text));

CREATE DOMAIN public.kairos_step_kind AS text
	CONSTRAINT kairos_step_kind_check CHECK ((VALUE = ANY (ARRAY['model'::text, 'tool'::text])));

CREATE DOMAIN public.kairos_step_state AS text
	CONSTRAINT kairos_step_state_check CHECK ((VALUE = ANY (ARRAY['running'::text, 'succeeded'::text, 'failed'::text, 'ambiguous'::text, 'waiting_approval'::text, 'denied'::text, 'not_sent_test'::text])));

CREATE DOMAIN public.kairos_stripe AS smallint
	CONSTRAINT kairos_stripe_check CHECK (((VALUE >= 0) AND (VALUE <= 7)));

CREATE FUNCTION public.kairos_admit_waiting(p_owner text, p_released_by uuid, p_now timestamp with time zone) RETURNS SETOF uuid
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_held integer;
    v_limit integer;
BEGIN
    SELECT w.slot_limit INTO v_limit
      FROM runs w
     WHERE w.owner COLLATE "C" = p_owner AND w.state = 'queued' AND w.admitted_at IS NULL
       AND w.blocked_by_run_id IS NULL AND w.paused_at IS NULL
       AND (w.held_until IS NULL OR w.held_until <= coalesce(p_now, now()))
     ORDER BY w.created_at, w.id
     LIMIT 1;
    IF v_limit IS NULL THEN
        RETURN;  -- nothing waits
    END IF;
    SELECT count(*) INTO v_held
      FROM runs h
     WHERE h.owner = p_owner AND (h.state = 'running' OR h.admitted_at IS NOT NULL);
    IF v_held >= v_limit THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH holders AS (
        SELECT h.schedule_id, h.concurrency_key
          FROM runs h
         WHERE h.owner = p_owner AND (h.state = 'running' OR h.admitted_at IS NOT NULL)
           AND h.concurrency_key IS NOT NULL
    ), candidates AS (
        SELECT w.id, w.schedule_id, w.concurrency_key, w.concurrency_limit, w.created_at
          FROM runs w
         WHERE w.owner COLLATE "C" = p_owner AND w.state = 'queued' AND w.admitted_at IS NULL
           AND w.blocked_by_run_id IS NULL AND w.paused_at IS NULL
           AND (w.held_until IS NULL OR w.held_until <= coalesce(p_now, now()))
         ORDER BY w.created_at, w.id
         LIMIT 100
    ), ranked AS (
        SELECT c.id, c.created_at,
               c.concurrency_key IS NULL
               OR row_number() OVER (PARTITION BY c.schedule_id, c.concurrency_key ORDER BY c.created_at, c.id)
                  + (SELECT count(*) FROM holders h
                      WHERE h.schedule_id = c.schedule_id AND h.concurrency_key = c.concurrency_key)
                  <= c.concurrency_limit AS fits
          FROM candidates c
    ), chosen AS (
        SELECT r.id FROM ranked r WHERE r.fits ORDER BY r.created_at, r.id LIMIT v_limit - v_held
    ), admitted AS (
        UPDATE runs u
           SET admitted_at = coalesce(p_now, now()),
               released_by = p_released_by,
               updated_at = coalesce(p_now, now())
          FROM chosen
         WHERE u.id = chosen.id AND u.state = 'queued' AND u.admitted_at IS NULL
           AND u.blocked_by_run_id IS NULL AND u.paused_at IS NULL
           AND (u.held_until IS NULL OR u.held_until <= coalesce(p_now, now()))
        RETURNING u.id
    )
    SELECT a.id FROM admitted a;
END;
$$;

CREATE FUNCTION public.kairos_agent_digest(agent jsonb) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT
    AS $$
    SELECT encode(sha256(convert_to(kairos_canonical_json(agent), 'UTF8')), 'hex')
$$;

CREATE FUNCTION public.kairos_allow_pruning() RETURNS void
    LANGUAGE sql
    AS $$
    SELECT set_config('kairos.pruning', 'on', true)
$$;

COMMENT ON FUNCTION public.kairos_allow_pruning() IS 'Lets the current transaction DELETE from occurrences, run_events and conversation_entries (the retention pruner only).';

CREATE FUNCTION public.kairos_canonical_json(value jsonb) RETURNS text
    LANGUAGE plpgsql IMMUTABLE STRICT
    AS $$
BEGIN
    CASE jsonb_typeof(value)
    WHEN 'object' THEN
        RETURN '{' || coalesce((SELECT string_agg(to_jsonb(e.key)::text || ':' || kairos_canonical_json(e.value), ','
                                                  ORDER BY e.key COLLATE "C")
                                  FROM jsonb_each(value) AS e), '') || '}';
    WHEN 'array' THEN
        RETURN '[' || coalesce((SELECT string_agg(kairos_canonical_json(a.value), ',' ORDER BY a.ordinal)
                                  FROM jsonb_array_elements(value) WITH ORDINALITY AS a(value, ordinal)), '') || ']';
    ELSE
        RETURN value::text;
    END CASE;
END
$$;

CREATE FUNCTION public.kairos_claim_slot_free(p_run uuid, p_owner text, p_schedule_id uuid, p_key text, p_key_limit integer, p_owner_slots integer) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_state text;
    v_admitted timestamptz;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('kairos.owner_slots:' || p_owner, 0));
    SELECT r.state, r.admitted_at INTO v_state, v_admitted FROM runs r WHERE r.id = p_run;
    IF v_state IS DISTINCT FROM 'queued' THEN
        RETURN false;
    END IF;
    IF v_admitted IS NOT NULL THEN
        RETURN true;
    END IF;
    RETURN (SELECT count(*) FROM (SELECT 1 FROM runs o
                                   WHERE o.owner = p_owner AND (o.state = 'running' OR o.admitted_at IS NOT NULL)
                                   LIMIT p_owner_slots) AS held) < p_owner_slots
           AND (p_key IS NULL
                OR (SELECT count(*) FROM runs k
                     WHERE k.owner = p_owner AND (k.state = 'running' OR k.admitted_at IS NOT NULL)
                       AND k.schedule_id = p_schedule_id AND k.concurrency_key = p_key) < p_key_limit);
END;
$$;

CREATE FUNCTION public.kairos_dispatch_at(schedule_id uuid, fire_at timestamp with time zone, jitter integer) RETURNS timestamp with time zone
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
    AS $$
BEGIN
    IF jitter <= 0 THEN
        RETURN fire_at;
    END IF;
    RETURN fire_at + make_interval(secs => (('x' || encode(substring(
               sha256(uuid_send(schedule_id) || int8send((extract(epoch FROM fire_at) * 1000000)::bigint))
               FROM 1 FOR 6), 'hex'))::bit(48)::bigint % (jitter + 1)));
END
$$;

CREATE FUNCTION public.kairos_record_revision() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    INSERT INTO schedule_revisions (schedule_id, revision, definition, valid_from)
    VALUES (NEW.id, NEW.revision, kairos_schedule_definition(NEW),
            CASE WHEN TG_OP = 'INSERT' THEN NEW.created_at ELSE NEW.updated_at END)
    ON CONFLICT (schedule_id, revision) DO NOTHING;
    RETURN NULL;
END;
$$;

CREATE FUNCTION public.kairos_refuse_delete() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF coalesce(current_setting('kairos.pruning', true), '') = 'on' THEN
        RETURN NULL;
    END IF;
    RAISE EXCEPTION '% rows are append-only: % is refused outside the retention pruner', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'restrict_violation',
              HINT = 'the pruner calls kairos_allow_pruning() in its transaction first';
END;
$$;

CREATE FUNCTION public.kairos_refuse_parent_delete() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    RAISE EXCEPTION '% rows are never deleted: the trace, effects and entries that name them have no foreign key',
        TG_TABLE_NAME
        USING ERRCODE = 'restrict_violation';
END;
$$;

CREATE FUNCTION public.kairos_refuse_revision_change() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    RAISE EXCEPTION 'schedule_revisions rows are immutable: % is refused', TG_OP
        USING ERRCODE = 'restrict_violation';
END;
$$;

CREATE FUNCTION public.kairos_refuse_update() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    RAISE EXCEPTION '% rows are immutable', TG_TABLE_NAME USING ERRCODE = 'restrict_violation';
END;
$$;

CREATE FUNCTION public.kairos_release_slots(p_owner text, p_released_by uuid, p_now timestamp with time zone) RETURNS SETOF uuid
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('kairos.owner_slots:' || p_owner, 0));
    RETURN QUERY SELECT * FROM kairos_admit_waiting(p_owner, p_released_by, p_now);
END;
$$;

CREATE FUNCTION public.kairos_run_events_insert() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF NEW.data IS NULL THEN
        RAISE EXCEPTION 'null value in column "data" of relation "run_events" violates not-null constraint'
            USING ERRCODE = 'not_null_violation';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM runs r WHERE r.id = NEW.run_id) THEN
        RAISE EXCEPTION 'insert or update on table "run_events" violates foreign key constraint "run_events_run_id_fkey"'
            USING ERRCODE = 'foreign_key_violation',
                  DETAIL = format('Key (run_id)=(%s) is not present in table "runs".', NEW.run_id);
    END IF;
    IF EXISTS (SELECT 1 FROM run_event_batches b
                WHERE b.run_id = NEW.run_id AND b.last_seq >= NEW.seq
                  AND b.last_seq - jsonb_array_length(b.events) < NEW.seq) THEN
        RAISE EXCEPTION 'duplicate key value violates unique constraint "run_events_pkey"'
            USING ERRCODE = 'unique_violation',
                  DETAIL = format('Key (run_id, seq)=(%s, %s) already exists.', NEW.run_id, NEW.seq);
    END IF;
    INSERT INTO run_event_batches (run_id, last_seq, at, attempt, fence, events)
    VALUES (NEW.run_id, NEW.seq, NEW.at, NEW.attempt, NEW.fence,
            jsonb_build_array(jsonb_build_object('type', NEW.type, 'step', NEW.step, 'data', NEW.data)));
    RETURN NEW;
END;
$$;

CREATE FUNCTION public.kairos_run_events_prune() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    b run_event_batches;
BEGIN
    DELETE FROM run_event_batches
     WHERE run_id = OLD.run_id AND last_seq >= OLD.seq AND last_seq - jsonb_array_length(events) < OLD.seq
    RETURNING * INTO b;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    INSERT INTO run_event_batches (run_id, last_seq, at, attempt, fence, events)
    SELECT b.run_id, max(p.seq), b.at, b.attempt, b.fence, jsonb_agg(p.event ORDER BY p.seq)
      FROM (SELECT (b.last_seq - jsonb_array_length(b.events) + x.ord)::integer AS seq, x.event
              FROM jsonb_array_elements(b.events) WITH ORDINALITY AS x (event, ord)) AS p
     WHERE p.seq <> OLD.seq
     GROUP BY p.seq > OLD.seq;
    RETURN OLD;
END;
$$;

CREATE FUNCTION public.kairos_run_usage(run uuid) RETURNS jsonb
    LANGUAGE plpgsql STABLE
    AS $$
BEGIN
    RETURN (SELECT jsonb_object_agg(s.key, s.total)
              FROM (SELECT u.key, sum((u.value #>> '{}')::numeric) AS total
                      FROM effects e CROSS JOIN LATERAL jsonb_each(e.usage) AS u(key, value)
                     WHERE e.run_id = run AND e.state = 'settled' AND jsonb_typeof(e.usage) = 'object'
                       AND jsonb_typeof(u.value) = 'number'
                     GROUP BY u.key) AS s);
END;
$$;

CREATE FUNCTION public.kairos_run_usage_with(run uuid, settling uuid, settling_usage jsonb) RETURNS jsonb
    LANGUAGE plpgsql STABLE
    AS $$
BEGIN
    RETURN (SELECT jsonb_object_agg(s.key, s.total)
              FROM (SELECT u.key, sum((u.value #>> '{}')::numeric) AS total
                      FROM (SELECT e.usage FROM effects e
                             WHERE e.run_id = run AND e.state = 'settled' AND e.id <> settling
                            UNION ALL
                            SELECT settling_usage) AS x (usage)
                     CROSS JOIN LATERAL jsonb_each(x.usage) AS u(key, value)
                     WHERE jsonb_typeof(x.usage) = 'object' AND jsonb_typeof(u.value) = 'number'
                     GROUP BY u.key) AS s);
END;
$$;

CREATE FUNCTION public.kairos_runs_give_up_slot() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    NEW.admitted_at := NULL;
    RETURN NEW;
END;
$$;

CREATE FUNCTION public.kairos_runs_release_slot() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(hashtextextended('kairos.owner_slots:' || NEW.owner, 0));
    PERFORM 1 FROM runs w
      WHERE w.owner COLLATE "C" = NEW.owner AND w.state = 'queued' AND w.admitted_at IS NULL
        AND w.blocked_by_run_id IS NULL AND w.paused_at IS NULL
      ORDER BY w.created_at, w.id
      LIMIT 1;
    IF FOUND THEN
        PERFORM pg_advisory_xact_lock(hashtextextended('kairos.owner_slot_ends:' || NEW.owner, 0));
        PERFORM kairos_admit_waiting(NEW.owner, NEW.id, NULL);
    END IF;
    RETURN NULL;
END;
$$;

CREATE TABLE public.schedules (
    id uuid NOT NULL,
    owner text NOT NULL,
    conversation_id uuid NOT NULL,
    name text DEFAULT ''::text NOT NULL,
    prompt text NOT NULL,
    kind text NOT NULL,
    cron text,
    interval_seconds integer,
    starts_at timestamp with time zone,
    ends_at timestamp with time zone,
    max_occurrences integer,
    timezone text DEFAULT 'UTC'::text NOT NULL,
    dst_gap text DEFAULT 'auto'::text NOT NULL,
    dst_fold text DEFAULT 'auto'::text NOT NULL,
    mode text DEFAULT 'fork'::text NOT NULL,
    catch_up boolean DEFAULT false NOT NULL,
    overlap text DEFAULT 'allow'::text NOT NULL,
    agent jsonb,
    signing jsonb,
    status text DEFAULT 'active'::text NOT NULL,
    revision integer DEFAULT 1 NOT NULL,
    next_fire_at timestamp with time zone,
    last_fire_at timestamp with time zone,
    fire_count integer DEFAULT 0 NOT NULL,
    consecutive_failures integer DEFAULT 0 NOT NULL,
    token_hash text,
    previous_token_hash text,
    previous_token_expires_at timestamp with time zone,
    rate_limit_per_minute integer,
    created_by_run_id uuid,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    max_delay_seconds integer DEFAULT 600 NOT NULL,
    notify jsonb DEFAULT '{"on": ["failed", "abandoned", "expired", "policy_blocked"]}'::jsonb NOT NULL,
    corpus jsonb,
    loop boolean DEFAULT false NOT NULL,
    goal jsonb,
    goal_revision integer,
    input_run_id uuid,
    flow jsonb,
    jitter_seconds integer DEFAULT 0 NOT NULL,
    next_dispatch_at timestamp with time zone GENERATED ALWAYS AS (public.kairos_dispatch_at(id, next_fire_at, jitter_seconds)) STORED,
    paused_at timestamp with time zone,
    paused_reason text,
    limits jsonb,
    CONSTRAINT schedules_consecutive_failures_check CHECK ((consecutive_failures >= 0)),
    CONSTRAINT schedules_draft_is_loop CHECK (((status <> 'draft'::text) OR loop)),
    CONSTRAINT schedules_dst_fold_check CHECK ((dst_fold = ANY (ARRAY['auto'::text, 'first'::text, 'last'::text, 'both'::text]))),
    CONSTRAINT schedules_dst_gap_check CHECK ((dst_gap = ANY (ARRAY['auto'::text, 'shift_forward'::text, 'skip'::text]))),
    CONSTRAINT schedules_fire_count_check CHECK ((fire_count >= 0)),
    CONSTRAINT schedules_goal_iff_loop CHECK (((goal IS NULL) = (NOT loop))),
    CONSTRAINT schedules_input_run_is_loop CHECK (((input_run_id IS NULL) OR loop)),
    CONSTRAINT schedules_interval_seconds_check CHECK (((interval_seconds IS NULL) OR (interval_seconds > 0))),
    CONSTRAINT schedules_jitter_bounds CHECK (((jitter_seconds >= 0) AND (jitter_seconds <= 3600))),
    CONSTRAINT schedules_kind_check CHECK ((kind = ANY (ARRAY['cron'::text, 'interval'::text, 'once'::text, 'webhook'::text]))),
    CONSTRAINT schedules_limits_check CHECK (((limits IS NULL) OR (jsonb_typeof(limits) = 'object'::text))),
    CONSTRAINT schedules_loop_policies CHECK (((NOT loop) OR ((goal IS NOT NULL) AND (goal_revision IS NOT NULL) AND (kind = ANY (ARRAY['cron'::text, 'interval'::text])) AND (catch_up = false) AND (overlap = 'skip'::text) AND (mode = 'append'::text) AND (ends_at IS NOT NULL) AND (max_occurrences IS NOT NULL) AND (max_occurrences <= 500)))),
    CONSTRAINT schedules_max_delay_bounds CHECK (((max_delay_seconds >= 60) AND (max_delay_seconds <= 86400))),
    CONSTRAINT schedules_max_occurrences_check CHECK (((max_occurrences IS NULL) OR (max_occurrences > 0))),
    CONSTRAINT schedules_mode_check CHECK ((mode = ANY (ARRAY['fork'::text, 'append'::text, 'fresh'::text]))),
    CONSTRAINT schedules_overlap_check CHECK ((overlap = ANY (ARRAY['allow'::text, 'skip'::text, 'queue_one'::text, 'cancel_replace'::text]))),
    CONSTRAINT schedules_owner_check CHECK ((owner <> ''::text)),
    CONSTRAINT schedules_paused_reason_bounded CHECK (((paused_reason IS NULL) OR (char_length(paused_reason) <= 500))),
    CONSTRAINT schedules_rate_limit_per_minute_check CHECK (((rate_limit_per_minute IS NULL) OR (rate_limit_per_minute > 0))),
    CONSTRAINT schedules_revision_check CHECK ((revision >= 1)),
    CONSTRAINT schedules_rule CHECK ((((kind = 'cron'::text) AND (cron IS NOT NULL)) OR ((kind = 'interval'::text) AND (interval_seconds IS NOT NULL) AND (starts_at IS NOT NULL)) OR ((kind = 'once'::text) AND (starts_at IS NOT NULL)) OR (kind = 'webhook'::text))),
    CONSTRAINT schedules_status_check CHECK ((status = ANY (ARRAY['draft'::text, 'active'::text, 'paused'::text, 'cancelled'::text, 'completed'::text]))),
    CONSTRAINT schedules_timed_cursor CHECK (((kind = 'webhook'::text) OR (status <> 'active'::text) OR (next_fire_at IS NOT NULL))),
    CONSTRAINT schedules_webhook_token CHECK (((kind = 'webhook'::text) = (token_hash IS NOT NULL))),
    CONSTRAINT schedules_window CHECK (((ends_at IS NULL) OR (starts_at IS NULL) OR (ends_at > starts_at)))
);

CREATE FUNCTION public.kairos_schedule_definition(s public.schedules) RETURNS jsonb
    LANGUAGE sql STABLE
    AS $$
    SELECT to_jsonb(s) - ARRAY['id', 'owner', 'conversation_id', 'status', 'revision', 'next_fire_at',
                               'next_dispatch_at', 'last_fire_at', 'fire_count', 'consecutive_failures',
                               'token_hash', 'previous_token_hash', 'previous_token_expires_at',
                               'created_by_run_id', 'created_at', 'updated_at', 'input_run_id',
                               'paused_at', 'paused_reason']
$$;

CREATE FUNCTION public.kairos_settle_usage() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
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

CREATE FUNCTION public.kairos_usage_reserve(p_owner text, p_day date, p_tokens bigint, p_cost numeric, p_max_tokens bigint, p_max_cost numeric, p_hint integer) RETURNS smallint
    LANGUAGE plpgsql
    AS $$
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

CREATE TABLE public.runs (
    id uuid NOT NULL,
    occurrence_id uuid NOT NULL,
    schedule_id uuid,
    owner public.kairos_owner NOT NULL,
    source public.kairos_run_source NOT NULL,
    source_conversation_id uuid NOT NULL,
    conversation_id uuid,
    mode public.kairos_run_mode NOT NULL,
    prompt text NOT NULL,
    payload jsonb,
    agent jsonb NOT NULL,
    catch_up boolean DEFAULT false NOT NULL,
    state public.kairos_run_state DEFAULT 'queued'::text NOT NULL,
    attempt public.kairos_nonneg_int DEFAULT 0 NOT NULL,
    max_attempts public.kairos_positive_int DEFAULT 3 NOT NULL,
    restarts public.kairos_nonneg_int DEFAULT 0 NOT NULL,
    fence public.kairos_nonneg_bigint DEFAULT 0 NOT NULL,
    lease_token uuid,
    lease_expires_at timestamp with time zone,
    heartbeat_at timestamp with time zone,
    cancel_requested_at timestamp with time zone,
    blocked_by_run_id uuid,
    handoff_at timestamp with time zone,
    handoff_count integer DEFAULT 0 NOT NULL,
    last_seq public.kairos_nonneg_int DEFAULT 0 NOT NULL,
    runtime_limit_seconds public.kairos_positive_int DEFAULT 600 NOT NULL,
    output jsonb,
    usage jsonb,
    diagnosis jsonb,
    settled_at timestamp with time zone,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    started_at timestamp with time zone,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    finished_at timestamp with time zone,
    expires_at timestamp with time zone,
    unclaimed_handoffs public.kairos_nonneg_int DEFAULT 0 NOT NULL,
    retry_of uuid,
    pruned_at timestamp with time zone,
    deferred_at timestamp with time zone,
    corpus jsonb,
    pause_requested_at timestamp with time zone,
    paused_at timestamp with time zone,
    held_until timestamp with time zone,
    flow_window public.kairos_flow_window,
    window_deadline timestamp with time zone,
    deliveries public.kairos_positive_int,
    test boolean DEFAULT false NOT NULL,
    resumed_from integer,
    max_steps public.kairos_positive_int DEFAULT 8 NOT NULL,
    schedule_revision public.kairos_positive_int,
    agent_digest public.kairos_sha256_hex,
    admitted_at timestamp with time zone,
    released_by uuid,
    slot_limit public.kairos_positive_int DEFAULT 4 NOT NULL,
    concurrency_key text,
    concurrency_limit public.kairos_positive_int,
    CONSTRAINT runs_concurrency_check CHECK (((concurrency_key IS NULL) OR (concurrency_limit IS NOT NULL))),
    CONSTRAINT runs_failed_has_diagnosis CHECK ((((state)::text <> ALL (ARRAY['failed'::text, 'abandoned'::text])) OR (diagnosis IS NOT NULL))),
    CONSTRAINT runs_finished_iff_terminal CHECK ((((state)::text = ANY (ARRAY['succeeded'::text, 'failed'::text, 'cancelled'::text, 'expired'::text, 'abandoned'::text, 'policy_blocked'::text])) = (finished_at IS NOT NULL))),
    CONSTRAINT runs_lease_iff_running CHECK (((((state)::text = 'running'::text) = (lease_token IS NOT NULL)) AND ((lease_token IS NULL) = (lease_expires_at IS NULL)))),
    CONSTRAINT runs_pruned_after_finish CHECK (((pruned_at IS NULL) OR (finished_at IS NOT NULL))),
    CONSTRAINT runs_resumed_from_is_retry CHECK (((resumed_from IS NULL) OR ((resumed_from >= 0) AND (retry_of IS NOT NULL)))),
    CONSTRAINT runs_schedule_iff_not_chat CHECK (((schedule_id IS NULL) = ((source)::text = 'chat'::text))),
    CONSTRAINT runs_settled_after_finish CHECK (((settled_at IS NULL) OR (finished_at IS NOT NULL))),
    CONSTRAINT runs_succeeded_has_output CHECK ((((state)::text <> 'succeeded'::text) OR (output IS NOT NULL))),
    CONSTRAINT runs_test_iff_source CHECK ((test = ((source)::text = 'test'::text))),
    CONSTRAINT runs_window_shape CHECK ((((flow_window IS NULL) = (deliveries IS NULL)) AND ((flow_window IS NULL) OR (held_until IS NOT NULL))))
)
WITH (fillfactor='50');

CREATE FUNCTION public.kairos_waiting_for(r public.runs) RETURNS text
    LANGUAGE sql STABLE
    AS $$
    SELECT CASE
        WHEN r.state <> 'queued' OR r.admitted_at IS NOT NULL OR r.blocked_by_run_id IS NOT NULL
             OR r.paused_at IS NOT NULL OR r.held_until > now() THEN NULL
        WHEN r.concurrency_key IS NOT NULL
             AND (SELECT count(*) FROM runs k
                   WHERE k.owner = r.owner AND (k.state = 'running' OR k.admitted_at IS NOT NULL)
                     AND k.schedule_id = r.schedule_id AND k.concurrency_key = r.concurrency_key)
                 >= r.concurrency_limit THEN 'key'
        ELSE 'slot'
    END
$$;

CREATE FUNCTION public.kairos_widen_check(tbl regclass, col text, added text[]) RETURNS void
    LANGUAGE plpgsql
    AS $$
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

CREATE FUNCTION public.kairos_widen_domain(dom regtype, added text[]) RETURNS void
    LANGUAGE plpgsql
    AS $$
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

CREATE TABLE public.approvals (
    id uuid NOT NULL,
    run_id uuid NOT NULL,
    owner text NOT NULL,
    state text DEFAULT 'pending'::text NOT NULL,
    attempt integer NOT NULL,
    step integer NOT NULL,
    call_id text NOT NULL,
    tool text NOT NULL,
    args_digest text NOT NULL,
    preview jsonb NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    decided_at timestamp with time zone,
    decided_by text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT approvals_decided CHECK (((state = 'pending'::text) = (decided_at IS NULL))),
    CONSTRAINT approvals_owner_check CHECK ((owner <> ''::text)),
    CONSTRAINT approvals_state_check CHECK ((state = ANY (ARRAY['pending'::text, 'approved'::text, 'applied'::text, 'denied'::text, 'expired'::text, 'retired'::text])))
);

CREATE TABLE public.conversation_entries (
    conversation_id uuid NOT NULL,
    seq public.kairos_positive_int NOT NULL,
    role public.kairos_entry_role NOT NULL,
    content text NOT NULL,
    run_id uuid,
    created_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE public.conversations (
    id uuid NOT NULL,
    owner public.kairos_owner NOT NULL,
    title text,
    agent jsonb NOT NULL,
    parent_id uuid,
    fork_seq public.kairos_nonneg_int,
    origin_run_id uuid,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT conversations_fork_point CHECK (((parent_id IS NULL) = (fork_seq IS NULL)))
);

CREATE TABLE public.corpus_exports (
    run_id uuid NOT NULL,
    format text NOT NULL,
    bucket text NOT NULL,
    key text NOT NULL,
    upload_id text,
    parts jsonb DEFAULT '[]'::jsonb NOT NULL,
    last_kind text,
    last_id text,
    bytes bigint DEFAULT 0 NOT NULL,
    sha256 text,
    done boolean DEFAULT false NOT NULL,
    updated_at timestamp with time zone NOT NULL,
    CONSTRAINT corpus_exports_format_check CHECK ((format = ANY (ARRAY['jsonl'::text, 'graphml'::text])))
);

CREATE TABLE public.corpus_items (
    run_id uuid NOT NULL,
    ordinal integer NOT NULL,
    key text NOT NULL,
    digest text NOT NULL,
    bytes bigint NOT NULL,
    CONSTRAINT corpus_items_bytes_check CHECK ((bytes >= 0)),
    CONSTRAINT corpus_items_ordinal_check CHECK ((ordinal >= 0))
);

CREATE TABLE public.corpus_outputs (
    run_id uuid NOT NULL,
    partition integer NOT NULL,
    line integer NOT NULL,
    kind text NOT NULL,
    id text NOT NULL,
    data jsonb NOT NULL
);

CREATE TABLE public.corpus_partitions (
    run_id uuid NOT NULL,
    n integer NOT NULL,
    first_ordinal integer NOT NULL,
    last_ordinal integer NOT NULL,
    state text DEFAULT 'pending'::text NOT NULL,
    generation integer DEFAULT 0 NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    lease_token uuid,
    lease_expires_at timestamp with time zone,
    answer text,
    answer_generation integer,
    records integer DEFAULT 0 NOT NULL,
    error_code text,
    updated_at timestamp with time zone NOT NULL,
    CONSTRAINT corpus_partitions_answer_generation CHECK (((answer IS NULL) = (answer_generation IS NULL))),
    CONSTRAINT corpus_partitions_attempts_check CHECK ((attempts >= 0)),
    CONSTRAINT corpus_partitions_generation_check CHECK (((generation >= 0) AND (generation <= 2))),
    CONSTRAINT corpus_partitions_lease_iff_running CHECK (((state = 'running'::text) = (lease_token IS NOT NULL))),
    CONSTRAINT corpus_partitions_n_check CHECK ((n >= 0)),
    CONSTRAINT corpus_partitions_state_check CHECK ((state = ANY (ARRAY['pending'::text, 'running'::text, 'succeeded'::text, 'failed'::text])))
);

CREATE TABLE public.corpus_records (
    run_id uuid NOT NULL,
    kind text NOT NULL,
    id text NOT NULL,
    data jsonb NOT NULL,
    lineage jsonb NOT NULL
);

CREATE TABLE public.corpus_runs (
    run_id uuid NOT NULL,
    owner text NOT NULL,
    phase text DEFAULT 'enumerate'::text NOT NULL,
    items_total integer DEFAULT 0 NOT NULL,
    partitions_total integer DEFAULT 0 NOT NULL,
    created_at timestamp with time zone NOT NULL,
    updated_at timestamp with time zone NOT NULL,
    CONSTRAINT corpus_runs_items_total_check CHECK ((items_total >= 0)),
    CONSTRAINT corpus_runs_partitions_total_check CHECK ((partitions_total >= 0)),
    CONSTRAINT corpus_runs_phase_check CHECK ((phase = ANY (ARRAY['enumerate'::text, 'map'::text, 'reconcile'::text, 'reduce'::text, 'export'::text, 'publish'::text, 'complete'::text])))
);

CREATE TABLE public.effects (
    id uuid NOT NULL,
    run_id uuid NOT NULL,
    fence bigint NOT NULL,
    attempt integer NOT NULL,
    step text NOT NULL,
    kind public.kairos_effect_kind NOT NULL,
    mutation boolean DEFAULT true NOT NULL,
    target text NOT NULL,
    request_digest text NOT NULL,
    state public.kairos_effect_state DEFAULT 'reserved'::text NOT NULL,
    usage jsonb,
    error_code text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    settled_at timestamp with time zone,
    charge_day date,
    charge_tokens public.kairos_nonneg_bigint,
    charge_cost_usd public.kairos_nonneg_numeric,
    charge_stripe public.kairos_stripe,
    CONSTRAINT effects_charge_whole CHECK ((((charge_day IS NULL) = (charge_tokens IS NULL)) AND ((charge_day IS NULL) = (charge_cost_usd IS NULL)))),
    CONSTRAINT effects_settled_iff_final CHECK ((((state)::text = 'reserved'::text) = (settled_at IS NULL)))
)
WITH (fillfactor='90');

CREATE TABLE public.idempotency_receipts (
    key_digest text NOT NULL,
    request_digest text NOT NULL,
    status integer NOT NULL,
    sealed bytea NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    CONSTRAINT idempotency_receipts_status_check CHECK (((status >= 200) AND (status <= 299)))
);

CREATE TABLE public.inbox_notes (
    id bigint NOT NULL,
    conversation_id uuid NOT NULL,
    box text DEFAULT 'notes'::text NOT NULL,
    kind text NOT NULL,
    body jsonb DEFAULT '{}'::jsonb NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT inbox_notes_box_check CHECK ((box = ANY (ARRAY['notes'::text, 'queued'::text])))
);

ALTER TABLE public.inbox_notes ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.inbox_notes_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE public.input_requests (
    id uuid NOT NULL,
    owner text NOT NULL,
    run_id uuid NOT NULL,
    attempt integer NOT NULL,
    step integer NOT NULL,
    call_id text NOT NULL,
    schedule_id uuid NOT NULL,
    revision integer NOT NULL,
    conversation_id uuid NOT NULL,
    question text NOT NULL,
    question_digest text NOT NULL,
    state text DEFAULT 'pending'::text NOT NULL,
    answer_digest text,
    answer_entry_seq bigint,
    decided_at timestamp with time zone,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT input_requests_answered CHECK ((((state = 'answered'::text) = (answer_digest IS NOT NULL)) AND ((answer_digest IS NULL) = (answer_entry_seq IS NULL)))),
    CONSTRAINT input_requests_decided CHECK (((state = 'pending'::text) = (decided_at IS NULL))),
    CONSTRAINT input_requests_owner_check CHECK ((owner <> ''::text)),
    CONSTRAINT input_requests_question_check CHECK (((length(question) >= 1) AND (length(question) <= 4000))),
    CONSTRAINT input_requests_state_check CHECK ((state = ANY (ARRAY['pending'::text, 'answered'::text, 'cancelled'::text, 'expired'::text])))
);

CREATE TABLE public.kairos_migrations (
    version integer NOT NULL,
    name text NOT NULL,
    checksum text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE public.notify_deliveries (
    run_id uuid NOT NULL,
    schedule_id uuid NOT NULL,
    owner text NOT NULL,
    url text NOT NULL,
    secret_ref text NOT NULL,
    state text DEFAULT 'pending'::text NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    next_attempt_at timestamp with time zone DEFAULT now() NOT NULL,
    last_status integer,
    last_error text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    finished_at timestamp with time zone,
    CONSTRAINT notify_deliveries_attempts_check CHECK ((attempts >= 0)),
    CONSTRAINT notify_deliveries_finished_iff_final CHECK (((state <> 'pending'::text) = (finished_at IS NOT NULL))),
    CONSTRAINT notify_deliveries_last_error_check CHECK ((length(last_error) <= 500)),
    CONSTRAINT notify_deliveries_owner_check CHECK ((owner <> ''::text)),
    CONSTRAINT notify_deliveries_state_check CHECK ((state = ANY (ARRAY['pending'::text, 'delivered'::text, 'gave_up'::text])))
);

CREATE TABLE public.occurrences (
    id uuid NOT NULL,
    schedule_id uuid,
    source public.kairos_run_source NOT NULL,
    fire_at timestamp with time zone NOT NULL,
    local_time timestamp without time zone NOT NULL,
    utc_offset interval NOT NULL,
    fold public.kairos_fold DEFAULT 0 NOT NULL,
    timezone text NOT NULL,
    tzdata_version text NOT NULL,
    schedule_revision integer NOT NULL,
    decision public.kairos_occurrence_decision NOT NULL,
    covers_from timestamp with time zone,
    covers_until timestamp with time zone,
    covers_count public.kairos_positive_int DEFAULT 1 NOT NULL,
    idempotency_key text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    key_generation public.kairos_nonneg_int DEFAULT 0 NOT NULL,
    coalesced_into uuid,
    dispatch_at timestamp with time zone,
    CONSTRAINT occurrences_coalesced_shape CHECK ((((decision)::text = 'coalesced'::text) = (coalesced_into IS NOT NULL))),
    CONSTRAINT occurrences_keyed CHECK ((((source)::text <> ALL (ARRAY['webhook'::text, 'manual'::text, 'test'::text])) OR (idempotency_key IS NOT NULL))),
    CONSTRAINT occurrences_schedule_iff_not_chat CHECK (((schedule_id IS NULL) = ((source)::text = 'chat'::text)))
);

CREATE TABLE public.run_event_batches (
    run_id uuid NOT NULL,
    last_seq integer NOT NULL,
    at timestamp with time zone NOT NULL,
    attempt public.kairos_nonneg_int NOT NULL,
    fence bigint DEFAULT 0 NOT NULL,
    events public.kairos_event_batch NOT NULL,
    CONSTRAINT run_event_batches_seq_check CHECK (((jsonb_typeof((events)::jsonb) = 'array'::text) AND (jsonb_array_length((events)::jsonb) >= 1) AND (last_seq >= jsonb_array_length((events)::jsonb))))
);

CREATE VIEW public.run_events AS
 SELECT b.run_id,
    (((b.last_seq - jsonb_array_length((b.events)::jsonb)) + x.ord))::integer AS seq,
    (x.event ->> 'type'::text) AS type,
    b.at,
    b.attempt,
    b.fence,
    (x.event ->> 'step'::text) AS step,
    COALESCE((x.event -> 'data'::text), '{}'::jsonb) AS data
   FROM (public.run_event_batches b
     CROSS JOIN LATERAL jsonb_array_elements((b.events)::jsonb) WITH ORDINALITY x(event, ord));

COMMENT ON VIEW public.run_events IS 'Each run''s append-only, gap-free trace, one row per event (stored as run_event_batches).';

CREATE TABLE public.run_steps (
    run_id uuid NOT NULL,
    n public.kairos_positive_int NOT NULL,
    kind public.kairos_step_kind NOT NULL,
    name text NOT NULL,
    call_id text,
    record jsonb,
    attempt integer NOT NULL,
    fence bigint NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    state public.kairos_step_state DEFAULT 'succeeded'::text NOT NULL,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    finished_at timestamp with time zone,
    input jsonb,
    output jsonb,
    target jsonb,
    usage jsonb,
    effect_id uuid,
    pruned_at timestamp with time zone,
    CONSTRAINT run_steps_finished_when_ended CHECK (((finished_at IS NULL) = ((state)::text = ANY (ARRAY['running'::text, 'waiting_approval'::text])))),
    CONSTRAINT run_steps_succeeded_has_record CHECK ((((state)::text <> 'succeeded'::text) OR (record IS NOT NULL) OR (pruned_at IS NOT NULL)))
);

CREATE TABLE public.schedule_revisions (
    schedule_id uuid NOT NULL,
    revision integer NOT NULL,
    definition jsonb NOT NULL,
    valid_from timestamp with time zone NOT NULL,
    CONSTRAINT schedule_revisions_revision_check CHECK ((revision >= 1))
);

CREATE TABLE public.usage_ledger_stripes (
    owner public.kairos_owner CONSTRAINT usage_ledger_owner_not_null NOT NULL,
    day date CONSTRAINT usage_ledger_day_not_null NOT NULL,
    reserved_tokens public.kairos_nonneg_bigint DEFAULT 0 CONSTRAINT usage_ledger_reserved_tokens_not_null NOT NULL,
    reserved_cost_usd public.kairos_nonneg_numeric DEFAULT 0 CONSTRAINT usage_ledger_reserved_cost_usd_not_null NOT NULL,
    input_tokens public.kairos_nonneg_bigint DEFAULT 0 CONSTRAINT usage_ledger_input_tokens_not_null NOT NULL,
    output_tokens public.kairos_nonneg_bigint DEFAULT 0 CONSTRAINT usage_ledger_output_tokens_not_null NOT NULL,
    cost_usd public.kairos_nonneg_numeric DEFAULT 0 CONSTRAINT usage_ledger_cost_usd_not_null NOT NULL,
    calls public.kairos_nonneg_int DEFAULT 0 CONSTRAINT usage_ledger_calls_not_null NOT NULL,
    runs public.kairos_nonneg_int DEFAULT 0 CONSTRAINT usage_ledger_runs_not_null NOT NULL,
    stripe public.kairos_stripe DEFAULT 0 NOT NULL,
    allowance_tokens bigint,
    allowance_cost_usd numeric,
    ceiling_tokens bigint,
    ceiling_cost_usd numeric
)
WITH (fillfactor='50');

CREATE VIEW public.usage_ledger AS
 SELECT owner,
    day,
    (sum((reserved_tokens)::bigint))::bigint AS reserved_tokens,
    sum((reserved_cost_usd)::numeric) AS reserved_cost_usd,
    (sum((input_tokens)::bigint))::bigint AS input_tokens,
    (sum((output_tokens)::bigint))::bigint AS output_tokens,
    sum((cost_usd)::numeric) AS cost_usd,
    (sum((calls)::integer))::integer AS calls,
    (sum((runs)::integer))::integer AS runs
   FROM public.usage_ledger_stripes
  GROUP BY owner, day;

CREATE VIEW public.usage_reservations AS
 SELECT e.id AS effect_id,
    e.run_id,
    r.owner,
    e.charge_day AS day,
    e.charge_tokens AS tokens,
    e.charge_cost_usd AS cost_usd,
        CASE
            WHEN ((e.state)::text = 'settled'::text) THEN GREATEST(COALESCE(((e.usage ->> 'input_tokens'::text))::bigint, (0)::bigint), (0)::bigint)
            ELSE NULL::bigint
        END AS input_tokens,
        CASE
            WHEN ((e.state)::text = 'settled'::text) THEN GREATEST(COALESCE(((e.usage ->> 'output_tokens'::text))::bigint, (0)::bigint), (0)::bigint)
            ELSE NULL::bigint
        END AS output_tokens,
        CASE
            WHEN ((e.state)::text = 'settled'::text) THEN GREATEST(COALESCE(((e.usage ->> 'cost_usd'::text))::numeric, (0)::numeric), (0)::numeric)
            ELSE NULL::numeric
        END AS used_cost_usd,
    e.settled_at
   FROM (public.effects e
     JOIN public.runs r ON ((r.id = e.run_id)))
  WHERE (e.charge_day IS NOT NULL);

CREATE TABLE public.webhook_receipts (
    schedule_id uuid NOT NULL,
    idempotency_key text NOT NULL,
    request_digest text NOT NULL,
    occurrence_id uuid NOT NULL,
    run_id uuid NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    generation integer DEFAULT 0 NOT NULL,
    CONSTRAINT webhook_receipts_generation_check CHECK ((generation >= 0))
);

ALTER TABLE ONLY public.run_events ALTER COLUMN at SET DEFAULT now();

ALTER TABLE ONLY public.run_events ALTER COLUMN fence SET DEFAULT 0;

ALTER TABLE ONLY public.run_events ALTER COLUMN data SET DEFAULT '{}'::jsonb;

ALTER TABLE ONLY public.approvals
    ADD CONSTRAINT approvals_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.approvals
    ADD CONSTRAINT approvals_run_id_step_call_id_key UNIQUE (run_id, step, call_id);

ALTER TABLE ONLY public.conversation_entries
    ADD CONSTRAINT conversation_entries_pkey PRIMARY KEY (conversation_id, seq);

ALTER TABLE ONLY public.conversations
    ADD CONSTRAINT conversations_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.corpus_exports
    ADD CONSTRAINT corpus_exports_pkey PRIMARY KEY (run_id, format);

ALTER TABLE ONLY public.corpus_items
    ADD CONSTRAINT corpus_items_pkey PRIMARY KEY (run_id, ordinal);

ALTER TABLE ONLY public.corpus_outputs
    ADD CONSTRAINT corpus_outputs_pkey PRIMARY KEY (run_id, partition, line);

ALTER TABLE ONLY public.corpus_partitions
    ADD CONSTRAINT corpus_partitions_pkey PRIMARY KEY (run_id, n);

ALTER TABLE ONLY public.corpus_records
    ADD CONSTRAINT corpus_records_pkey PRIMARY KEY (run_id, kind, id);

ALTER TABLE ONLY public.corpus_runs
    ADD CONSTRAINT corpus_runs_pkey PRIMARY KEY (run_id);

ALTER TABLE ONLY public.effects
    ADD CONSTRAINT effects_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.effects
    ADD CONSTRAINT effects_run_id_fence_step_key UNIQUE (run_id, fence, step);

ALTER TABLE ONLY public.idempotency_receipts
    ADD CONSTRAINT idempotency_receipts_pkey PRIMARY KEY (key_digest);

ALTER TABLE ONLY public.inbox_notes
    ADD CONSTRAINT inbox_notes_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.input_requests
    ADD CONSTRAINT input_requests_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.input_requests
    ADD CONSTRAINT input_requests_run_id_step_call_id_key UNIQUE (run_id, step, call_id);

ALTER TABLE ONLY public.kairos_migrations
    ADD CONSTRAINT kairos_migrations_pkey PRIMARY KEY (version);

ALTER TABLE ONLY public.notify_deliveries
    ADD CONSTRAINT notify_deliveries_pkey PRIMARY KEY (run_id);

ALTER TABLE ONLY public.occurrences
    ADD CONSTRAINT occurrences_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.run_event_batches
    ADD CONSTRAINT run_event_batches_pkey PRIMARY KEY (run_id, last_seq);

ALTER TABLE ONLY public.run_steps
    ADD CONSTRAINT run_steps_pkey PRIMARY KEY (run_id, n);

ALTER TABLE ONLY public.runs
    ADD CONSTRAINT runs_occurrence_id_key UNIQUE (occurrence_id);

ALTER TABLE ONLY public.runs
    ADD CONSTRAINT runs_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.schedule_revisions
    ADD CONSTRAINT schedule_revisions_pkey PRIMARY KEY (schedule_id, revision);

ALTER TABLE ONLY public.schedules
    ADD CONSTRAINT schedules_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.usage_ledger_stripes
    ADD CONSTRAINT usage_ledger_stripes_pkey PRIMARY KEY (owner, day, stripe);

ALTER TABLE ONLY public.webhook_receipts
    ADD CONSTRAINT webhook_receipts_pkey PRIMARY KEY (schedule_id, idempotency_key);

CREATE INDEX approvals_owner_idx ON public.approvals USING btree (owner, state, created_at DESC);

CREATE INDEX approvals_pending_expiry_idx ON public.approvals USING btree (expires_at) WHERE ((state = 'pending'::text) AND (decided_at IS NULL));

CREATE INDEX conversations_owner_idx ON public.conversations USING btree (owner, created_at DESC, id DESC);

CREATE INDEX conversations_parent_idx ON public.conversations USING btree (parent_id) WHERE (parent_id IS NOT NULL);

CREATE INDEX idempotency_receipts_expires_idx ON public.idempotency_receipts USING btree (expires_at);

CREATE INDEX inbox_notes_conversation_idx ON public.inbox_notes USING btree (conversation_id, box, id DESC);

CREATE UNIQUE INDEX input_requests_one_pending_idx ON public.input_requests USING btree (run_id) WHERE ((state = 'pending'::text) AND (run_id IS NOT NULL));

CREATE INDEX input_requests_owner_idx ON public.input_requests USING btree (owner, state, created_at DESC);

CREATE INDEX input_requests_schedule_pending_idx ON public.input_requests USING btree (schedule_id) WHERE ((state = 'pending'::text) AND (schedule_id IS NOT NULL));

CREATE INDEX notify_deliveries_due_idx ON public.notify_deliveries USING btree (next_attempt_at) WHERE ((state = 'pending'::text) AND (next_attempt_at IS NOT NULL));

CREATE INDEX notify_deliveries_schedule_idx ON public.notify_deliveries USING btree (schedule_id);

CREATE UNIQUE INDEX occurrences_keyed_key ON public.occurrences USING btree (schedule_id, source, idempotency_key, key_generation) WHERE ((source)::text = ANY (ARRAY['webhook'::text, 'manual'::text]));

CREATE INDEX occurrences_schedule_idx ON public.occurrences USING btree (schedule_id, fire_at DESC, id DESC);

CREATE UNIQUE INDEX occurrences_timed_key ON public.occurrences USING btree (schedule_id, source, fire_at) WHERE ((source)::text = ANY (ARRAY['scheduled'::text, 'backfill'::text]));

CREATE INDEX runs_blocked_idx ON public.runs USING btree (blocked_by_run_id) WHERE (blocked_by_run_id IS NOT NULL);

CREATE INDEX runs_conversation_chat_idx ON public.runs USING btree (source_conversation_id, created_at) WHERE ((source)::text = 'chat'::text);

CREATE INDEX runs_handoff_idx ON public.runs USING btree (created_at) WHERE (((state)::text = 'queued'::text) AND (blocked_by_run_id IS NULL) AND ((max_attempts)::integer >= 1));

CREATE INDEX runs_hook_dispatch_idx ON public.runs USING btree (schedule_id, held_until) WHERE (((source)::text = 'webhook'::text) AND (held_until IS NOT NULL));

CREATE INDEX runs_owner_active_idx ON public.runs USING btree (owner, state) WHERE (((state)::text = ANY (ARRAY['queued'::text, 'awaiting_approval'::text, 'awaiting_input'::text])) AND (owner IS NOT NULL));

CREATE INDEX runs_owner_created_idx ON public.runs USING btree (owner, created_at DESC, id DESC);

CREATE INDEX runs_prunable_idx ON public.runs USING btree (finished_at) WHERE ((pruned_at IS NULL) AND (settled_at IS NOT NULL));

CREATE INDEX runs_released_by_idx ON public.runs USING btree (released_by) WHERE (released_by IS NOT NULL);

CREATE UNIQUE INDEX runs_retry_of_idx ON public.runs USING btree (retry_of) WHERE (retry_of IS NOT NULL);

CREATE INDEX runs_schedule_active_idx ON public.runs USING btree (schedule_id) WHERE (((state)::text = ANY (ARRAY['queued'::text, 'awaiting_approval'::text, 'awaiting_input'::text])) AND (schedule_id IS NOT NULL));

CREATE INDEX runs_schedule_backfill_idx ON public.runs USING btree (schedule_id, created_at DESC) WHERE ((source)::text = 'backfill'::text);

CREATE INDEX runs_schedule_created_idx ON public.runs USING btree (schedule_id, created_at DESC, id DESC) WHERE (schedule_id IS NOT NULL);

CREATE INDEX runs_slot_holders_idx ON public.runs USING btree (owner) WHERE (((state)::text = 'running'::text) OR (admitted_at IS NOT NULL));

CREATE INDEX runs_slot_waiting_idx ON public.runs USING btree (owner COLLATE "C", created_at, id) WHERE (((state)::text = 'queued'::text) AND (admitted_at IS NULL) AND (blocked_by_run_id IS NULL) AND (paused_at IS NULL));

CREATE INDEX runs_unsettled_chat_idx ON public.runs USING btree (finished_at) WHERE ((schedule_id IS NULL) AND (finished_at IS NOT NULL) AND (settled_at IS NULL));

CREATE INDEX runs_unsettled_idx ON public.runs USING btree (finished_at) WHERE ((finished_at IS NOT NULL) AND (settled_at IS NULL));

CREATE INDEX schedules_conversation_idx ON public.schedules USING btree (conversation_id, created_at);

CREATE INDEX schedules_due_key_idx ON public.schedules USING btree (next_dispatch_at, id) WHERE ((status = 'active'::text) AND (next_dispatch_at IS NOT NULL));

CREATE INDEX schedules_owner_idx ON public.schedules USING btree (owner, created_at, id);

CREATE UNIQUE INDEX schedules_previous_token_hash_key ON public.schedules USING btree (previous_token_hash) WHERE (previous_token_hash IS NOT NULL);

CREATE UNIQUE INDEX schedules_token_hash_key ON public.schedules USING btree (token_hash) WHERE (token_hash IS NOT NULL);

CREATE INDEX webhook_receipts_expires_idx ON public.webhook_receipts USING btree (expires_at);

CREATE TRIGGER conversation_entries_immutable BEFORE UPDATE ON public.conversation_entries FOR EACH ROW EXECUTE FUNCTION public.kairos_refuse_update();

CREATE TRIGGER conversation_entries_no_delete BEFORE DELETE ON public.conversation_entries FOR EACH STATEMENT EXECUTE FUNCTION public.kairos_refuse_delete();

CREATE TRIGGER conversation_entries_no_truncate BEFORE TRUNCATE ON public.conversation_entries FOR EACH STATEMENT EXECUTE FUNCTION public.kairos_refuse_delete();

CREATE TRIGGER conversations_no_delete BEFORE DELETE ON public.conversations FOR EACH STATEMENT EXECUTE FUNCTION public.kairos_refuse_parent_delete();

CREATE TRIGGER conversations_no_truncate BEFORE TRUNCATE ON public.conversations FOR EACH STATEMENT EXECUTE FUNCTION public.kairos_refuse_parent_delete();

CREATE CONSTRAINT TRIGGER effects_settle_usage AFTER UPDATE OF state ON public.effects DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN ((((old.state)::text = 'reserved'::text) AND ((new.state)::text <> 'reserved'::text))) EXECUTE FUNCTION public.kairos_settle_usage();

CREATE TRIGGER occurrences_immutable BEFORE UPDATE ON public.occurrences FOR EACH ROW EXECUTE FUNCTION public.kairos_refuse_update();

CREATE TRIGGER occurrences_no_delete BEFORE DELETE ON public.occurrences FOR EACH STATEMENT EXECUTE FUNCTION public.kairos_refuse_delete();

CREATE TRIGGER occurrences_no_truncate BEFORE TRUNCATE ON public.occurrences FOR EACH STATEMENT EXECUTE FUNCTION public.kairos_refuse_delete();

CREATE TRIGGER run_event_batches_immutable BEFORE UPDATE ON public.run_event_batches FOR EACH ROW EXECUTE FUNCTION public.kairos_refuse_update();

CREATE TRIGGER run_event_batches_no_delete BEFORE DELETE ON public.run_event_batches FOR EACH STATEMENT EXECUTE FUNCTION public.kairos_refuse_delete();

CREATE TRIGGER run_event_batches_no_truncate BEFORE TRUNCATE ON public.run_event_batches FOR EACH STATEMENT EXECUTE FUNCTION public.kairos_refuse_delete();

CREATE TRIGGER run_events_immutable INSTEAD OF UPDATE ON public.run_events FOR EACH ROW EXECUTE FUNCTION public.kairos_refuse_update();

CREATE TRIGGER run_events_insert INSTEAD OF INSERT ON public.run_events FOR EACH ROW EXECUTE FUNCTION public.kairos_run_events_insert();

CREATE TRIGGER run_events_no_delete BEFORE DELETE ON public.run_events FOR EACH STATEMENT EXECUTE FUNCTION public.kairos_refuse_delete();

CREATE TRIGGER run_events_prune INSTEAD OF DELETE ON public.run_events FOR EACH ROW EXECUTE FUNCTION public.kairos_run_events_prune();

CREATE TRIGGER run_steps_no_delete BEFORE DELETE ON public.run_steps FOR EACH STATEMENT EXECUTE FUNCTION public.kairos_refuse_delete();

CREATE TRIGGER runs_give_up_slot BEFORE UPDATE ON public.runs FOR EACH ROW WHEN (((new.admitted_at IS NOT NULL) AND (((new.state)::text <> ALL (ARRAY['queued'::text, 'running'::text])) OR (new.paused_at IS NOT NULL)))) EXECUTE FUNCTION public.kairos_runs_give_up_slot();

CREATE TRIGGER runs_no_delete BEFORE DELETE ON public.runs FOR EACH STATEMENT EXECUTE FUNCTION public.kairos_refuse_parent_delete();

CREATE TRIGGER runs_no_truncate BEFORE TRUNCATE ON public.runs FOR EACH STATEMENT EXECUTE FUNCTION public.kairos_refuse_parent_delete();

CREATE TRIGGER runs_release_slot AFTER UPDATE ON public.runs FOR EACH ROW WHEN (((((old.state)::text = 'running'::text) OR (old.admitted_at IS NOT NULL)) AND (NOT (((new.state)::text = 'running'::text) OR (new.admitted_at IS NOT NULL))))) EXECUTE FUNCTION public.kairos_runs_release_slot();

CREATE TRIGGER schedule_revisions_immutable BEFORE UPDATE ON public.schedule_revisions FOR EACH STATEMENT EXECUTE FUNCTION public.kairos_refuse_revision_change();

CREATE TRIGGER schedules_record_revision_insert AFTER INSERT ON public.schedules FOR EACH ROW EXECUTE FUNCTION public.kairos_record_revision();

CREATE TRIGGER schedules_record_revision_update AFTER UPDATE OF revision ON public.schedules FOR EACH ROW WHEN ((new.revision <> old.revision)) EXECUTE FUNCTION public.kairos_record_revision();

ALTER TABLE ONLY public.approvals
    ADD CONSTRAINT approvals_run_id_fkey FOREIGN KEY (run_id) REFERENCES public.runs(id);

ALTER TABLE ONLY public.corpus_exports
    ADD CONSTRAINT corpus_exports_run_id_fkey FOREIGN KEY (run_id) REFERENCES public.corpus_runs(run_id);

ALTER TABLE ONLY public.corpus_items
    ADD CONSTRAINT corpus_items_run_id_fkey FOREIGN KEY (run_id) REFERENCES public.corpus_runs(run_id);

ALTER TABLE ONLY public.corpus_outputs
    ADD CONSTRAINT corpus_outputs_run_id_partition_fkey FOREIGN KEY (run_id, partition) REFERENCES public.corpus_partitions(run_id, n);

ALTER TABLE ONLY public.corpus_partitions
    ADD CONSTRAINT corpus_partitions_run_id_fkey FOREIGN KEY (run_id) REFERENCES public.corpus_runs(run_id);

ALTER TABLE ONLY public.corpus_records
    ADD CONSTRAINT corpus_records_run_id_fkey FOREIGN KEY (run_id) REFERENCES public.corpus_runs(run_id);

ALTER TABLE ONLY public.corpus_runs
    ADD CONSTRAINT corpus_runs_run_id_fkey FOREIGN KEY (run_id) REFERENCES public.runs(id);

ALTER TABLE ONLY public.inbox_notes
    ADD CONSTRAINT inbox_notes_conversation_id_fkey FOREIGN KEY (conversation_id) REFERENCES public.conversations(id);

ALTER TABLE ONLY public.input_requests
    ADD CONSTRAINT input_requests_conversation_id_fkey FOREIGN KEY (conversation_id) REFERENCES public.conversations(id);

ALTER TABLE ONLY public.input_requests
    ADD CONSTRAINT input_requests_run_id_fkey FOREIGN KEY (run_id) REFERENCES public.runs(id);

ALTER TABLE ONLY public.input_requests
    ADD CONSTRAINT input_requests_schedule_id_fkey FOREIGN KEY (schedule_id) REFERENCES public.schedules(id);

ALTER TABLE ONLY public.notify_deliveries
    ADD CONSTRAINT notify_deliveries_run_id_fkey FOREIGN KEY (run_id) REFERENCES public.runs(id);

ALTER TABLE ONLY public.notify_deliveries
    ADD CONSTRAINT notify_deliveries_schedule_id_fkey FOREIGN KEY (schedule_id) REFERENCES public.schedules(id);

ALTER TABLE ONLY public.occurrences
    ADD CONSTRAINT occurrences_schedule_id_fkey FOREIGN KEY (schedule_id) REFERENCES public.schedules(id);

ALTER TABLE ONLY public.run_steps
    ADD CONSTRAINT run_steps_run_id_fkey FOREIGN KEY (run_id) REFERENCES public.runs(id);

ALTER TABLE ONLY public.runs
    ADD CONSTRAINT runs_blocked_by_run_id_fkey FOREIGN KEY (blocked_by_run_id) REFERENCES public.runs(id);

ALTER TABLE ONLY public.runs
    ADD CONSTRAINT runs_occurrence_id_fkey FOREIGN KEY (occurrence_id) REFERENCES public.occurrences(id);

ALTER TABLE ONLY public.runs
    ADD CONSTRAINT runs_retry_of_fkey FOREIGN KEY (retry_of) REFERENCES public.runs(id);

ALTER TABLE ONLY public.runs
    ADD CONSTRAINT runs_schedule_id_fkey FOREIGN KEY (schedule_id) REFERENCES public.schedules(id);

ALTER TABLE ONLY public.runs
    ADD CONSTRAINT runs_source_conversation_id_fkey FOREIGN KEY (source_conversation_id) REFERENCES public.conversations(id);

ALTER TABLE ONLY public.schedule_revisions
    ADD CONSTRAINT schedule_revisions_schedule_id_fkey FOREIGN KEY (schedule_id) REFERENCES public.schedules(id);

ALTER TABLE ONLY public.schedules
    ADD CONSTRAINT schedules_conversation_id_fkey FOREIGN KEY (conversation_id) REFERENCES public.conversations(id);

ALTER TABLE ONLY public.schedules
    ADD CONSTRAINT schedules_input_run_id_fkey FOREIGN KEY (input_run_id) REFERENCES public.runs(id);

ALTER TABLE ONLY public.webhook_receipts
    ADD CONSTRAINT webhook_receipts_occurrence_id_fkey FOREIGN KEY (occurrence_id) REFERENCES public.occurrences(id);

ALTER TABLE ONLY public.webhook_receipts
    ADD CONSTRAINT webhook_receipts_run_id_fkey FOREIGN KEY (run_id) REFERENCES public.runs(id);

ALTER TABLE ONLY public.webhook_receipts
    ADD CONSTRAINT webhook_receipts_schedule_id_fkey FOREIGN KEY (schedule_id) REFERENCES public.schedules(id);
