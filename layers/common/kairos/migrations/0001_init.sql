-- Kairos schema, version 1: every table of the record (docs/architecture.md).
--
-- State values here are the same as the StrEnums in kairos/states.py (a test compares them).
-- Check constraints tie columns to state, River-style: lease columns are set exactly when a run is
-- running, finished_at exactly when it is terminal. Occurrences and run events are immutable; a
-- trigger refuses updates so no code path can rewrite what happened.

CREATE TABLE conversations (
    id            uuid PRIMARY KEY,
    owner         text NOT NULL CHECK (owner <> ''),
    title         text,
    agent         jsonb NOT NULL,
    -- A fork is its parent's transcript up to fork_seq plus its own entries: no copy is made.
    parent_id     uuid REFERENCES conversations (id),
    fork_seq      integer,
    -- The run that created this conversation (a fork or a fresh target), for "descends from a
    -- scheduled run" checks.
    origin_run_id uuid,
    created_at    timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT conversations_fork_point CHECK ((parent_id IS NULL) = (fork_seq IS NULL)),
    CONSTRAINT conversations_fork_seq_nonneg CHECK (fork_seq IS NULL OR fork_seq >= 0)
);
CREATE INDEX conversations_owner_idx ON conversations (owner, created_at);

-- seq continues the parent's numbering after fork_seq, so a position names one entry in the
-- merged transcript of a fork.
CREATE TABLE conversation_entries (
    conversation_id uuid NOT NULL REFERENCES conversations (id),
    seq             integer NOT NULL CHECK (seq >= 1),
    role            text NOT NULL CHECK (role IN ('system', 'user', 'assistant', 'tool')),
    content         text NOT NULL,
    run_id          uuid,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (conversation_id, seq)
);

-- The inbox of a conversation: "notes" (newest 50 kept) and "queued" (never pruned by notes).
CREATE TABLE inbox_notes (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    conversation_id uuid NOT NULL REFERENCES conversations (id),
    box             text NOT NULL DEFAULT 'notes' CHECK (box IN ('notes', 'queued')),
    kind            text NOT NULL,
    body            jsonb NOT NULL DEFAULT '{}',
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX inbox_notes_conversation_idx ON inbox_notes (conversation_id, box, id DESC);

-- status: active (moved out by the tick: completed; by the API: paused, cancelled; by settle:
-- paused), paused (moved out by resume or cancel), cancelled and completed (final).
CREATE TABLE schedules (
    id                        uuid PRIMARY KEY,
    owner                     text NOT NULL CHECK (owner <> ''),
    conversation_id           uuid NOT NULL REFERENCES conversations (id),
    name                      text NOT NULL DEFAULT '',
    prompt                    text NOT NULL,
    kind                      text NOT NULL CHECK (kind IN ('cron', 'interval', 'once', 'webhook')),
    cron                      text,
    interval_seconds          integer CHECK (interval_seconds IS NULL OR interval_seconds > 0),
    starts_at                 timestamptz,
    ends_at                   timestamptz,
    max_occurrences           integer CHECK (max_occurrences IS NULL OR max_occurrences > 0),
    timezone                  text NOT NULL DEFAULT 'UTC',
    dst_gap                   text NOT NULL DEFAULT 'auto' CHECK (dst_gap IN ('auto', 'shift_forward', 'skip')),
    dst_fold                  text NOT NULL DEFAULT 'auto' CHECK (dst_fold IN ('auto', 'first', 'last', 'both')),
    mode                      text NOT NULL DEFAULT 'fork' CHECK (mode IN ('fork', 'append', 'fresh')),
    catch_up                  boolean NOT NULL DEFAULT false,
    overlap                   text NOT NULL DEFAULT 'allow' CHECK (overlap IN ('allow', 'skip', 'queue_one')),
    agent                     jsonb,
    signing                   jsonb,
    status                    text NOT NULL DEFAULT 'active'
                              CHECK (status IN ('active', 'paused', 'cancelled', 'completed')),
    revision                  integer NOT NULL DEFAULT 1 CHECK (revision >= 1),
    next_fire_at              timestamptz,
    last_fire_at              timestamptz,
    fire_count                integer NOT NULL DEFAULT 0 CHECK (fire_count >= 0),
    consecutive_failures      integer NOT NULL DEFAULT 0 CHECK (consecutive_failures >= 0),
    -- Webhook token: only its SHA-256 hex. The previous hash stays valid until it expires.
    token_hash                text UNIQUE,
    previous_token_hash       text UNIQUE,
    previous_token_expires_at timestamptz,
    rate_limit_per_minute     integer CHECK (rate_limit_per_minute IS NULL OR rate_limit_per_minute > 0),
    created_by_run_id         uuid,
    created_at                timestamptz NOT NULL DEFAULT now(),
    updated_at                timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT schedules_rule CHECK (
        (kind = 'cron' AND cron IS NOT NULL)
        OR (kind = 'interval' AND interval_seconds IS NOT NULL AND starts_at IS NOT NULL)
        OR (kind = 'once' AND starts_at IS NOT NULL)
        OR (kind = 'webhook')
    ),
    CONSTRAINT schedules_webhook_token CHECK ((kind = 'webhook') = (token_hash IS NOT NULL)),
    CONSTRAINT schedules_timed_cursor CHECK (kind = 'webhook' OR status <> 'active' OR next_fire_at IS NOT NULL),
    CONSTRAINT schedules_window CHECK (ends_at IS NULL OR starts_at IS NULL OR ends_at > starts_at)
);
CREATE INDEX schedules_due_idx ON schedules (next_fire_at) WHERE status = 'active';
CREATE INDEX schedules_conversation_idx ON schedules (conversation_id, created_at);
CREATE INDEX schedules_owner_idx ON schedules (owner, created_at);

-- One opportunity, immutable. decision: dispatched, skipped_late, skipped_overlap, queued_behind,
-- expired. covers_* describe the range a skipped or collapsed fire stands for.
CREATE TABLE occurrences (
    id                uuid PRIMARY KEY,
    schedule_id       uuid NOT NULL REFERENCES schedules (id),
    source            text NOT NULL CHECK (source IN ('scheduled', 'manual', 'backfill', 'webhook')),
    fire_at           timestamptz NOT NULL,
    local_time        timestamp NOT NULL,
    utc_offset        interval NOT NULL,
    fold              smallint NOT NULL DEFAULT 0 CHECK (fold IN (0, 1)),
    timezone          text NOT NULL,
    tzdata_version    text NOT NULL,
    schedule_revision integer NOT NULL,
    decision          text NOT NULL
                      CHECK (decision IN ('dispatched', 'skipped_late', 'skipped_overlap', 'queued_behind', 'expired')),
    covers_from       timestamptz,
    covers_until      timestamptz,
    covers_count      integer NOT NULL DEFAULT 1 CHECK (covers_count >= 1),
    idempotency_key   text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT occurrences_keyed CHECK (source NOT IN ('webhook', 'manual') OR idempotency_key IS NOT NULL)
);
-- A duplicate tick converges on the same row for timed sources.
CREATE UNIQUE INDEX occurrences_timed_key ON occurrences (schedule_id, source, fire_at)
    WHERE source IN ('scheduled', 'backfill');
CREATE UNIQUE INDEX occurrences_keyed_key ON occurrences (schedule_id, source, idempotency_key)
    WHERE source IN ('webhook', 'manual');
CREATE INDEX occurrences_schedule_idx ON occurrences (schedule_id, fire_at DESC);

-- One execution. state: queued (moved out by the run claim, cancel, or the tick's repair),
-- running (moved out by its fenced worker, or by the tick's rescue once the lease expired),
-- awaiting_approval (reserved for approval waits), then terminal: succeeded, failed, cancelled,
-- expired, abandoned, policy_blocked.
CREATE TABLE runs (
    id                     uuid PRIMARY KEY,
    occurrence_id          uuid NOT NULL UNIQUE REFERENCES occurrences (id),
    schedule_id            uuid NOT NULL REFERENCES schedules (id),
    owner                  text NOT NULL CHECK (owner <> ''),
    source                 text NOT NULL CHECK (source IN ('scheduled', 'manual', 'backfill', 'webhook')),
    source_conversation_id uuid NOT NULL REFERENCES conversations (id),
    conversation_id        uuid REFERENCES conversations (id),
    mode                   text NOT NULL CHECK (mode IN ('fork', 'append', 'fresh')),
    prompt                 text NOT NULL,
    payload                jsonb,
    agent                  jsonb NOT NULL,
    catch_up               boolean NOT NULL DEFAULT false,
    state                  text NOT NULL DEFAULT 'queued' CHECK (state IN (
                               'queued', 'running', 'awaiting_approval',
                               'succeeded', 'failed', 'cancelled', 'expired', 'abandoned', 'policy_blocked')),
    attempt                integer NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    max_attempts           integer NOT NULL DEFAULT 3 CHECK (max_attempts >= 1),
    restarts               integer NOT NULL DEFAULT 0 CHECK (restarts >= 0),
    fence                  bigint NOT NULL DEFAULT 0 CHECK (fence >= 0),
    lease_token            uuid,
    lease_expires_at       timestamptz,
    heartbeat_at           timestamptz,
    cancel_requested_at    timestamptz,
    -- queue_one: this run waits for that one to end before it is handed to SQS.
    blocked_by_run_id      uuid REFERENCES runs (id),
    handoff_at             timestamptz,
    handoff_count          integer NOT NULL DEFAULT 0,
    last_seq               integer NOT NULL DEFAULT 0 CHECK (last_seq >= 0),
    runtime_limit_seconds  integer NOT NULL DEFAULT 600 CHECK (runtime_limit_seconds > 0),
    output                 jsonb,
    usage                  jsonb,
    diagnosis              jsonb,
    settled_at             timestamptz,
    created_at             timestamptz NOT NULL DEFAULT now(),
    started_at             timestamptz,
    updated_at             timestamptz NOT NULL DEFAULT now(),
    finished_at            timestamptz,
    CONSTRAINT runs_lease_iff_running CHECK (
        (state = 'running') = (lease_token IS NOT NULL)
        AND (lease_token IS NULL) = (lease_expires_at IS NULL)
    ),
    CONSTRAINT runs_finished_iff_terminal CHECK (
        (state IN ('succeeded', 'failed', 'cancelled', 'expired', 'abandoned', 'policy_blocked'))
        = (finished_at IS NOT NULL)
    ),
    CONSTRAINT runs_failed_has_diagnosis CHECK (state NOT IN ('failed', 'abandoned') OR diagnosis IS NOT NULL),
    CONSTRAINT runs_succeeded_has_output CHECK (state <> 'succeeded' OR output IS NOT NULL),
    CONSTRAINT runs_settled_after_finish CHECK (settled_at IS NULL OR finished_at IS NOT NULL)
);
CREATE INDEX runs_handoff_idx ON runs (handoff_at NULLS FIRST, created_at) WHERE state = 'queued';
CREATE INDEX runs_lease_idx ON runs (lease_expires_at) WHERE state = 'running';
CREATE INDEX runs_unsettled_idx ON runs (finished_at) WHERE finished_at IS NOT NULL AND settled_at IS NULL;
CREATE INDEX runs_schedule_active_idx ON runs (schedule_id)
    WHERE state IN ('queued', 'running', 'awaiting_approval');
CREATE INDEX runs_blocked_idx ON runs (blocked_by_run_id) WHERE blocked_by_run_id IS NOT NULL;
CREATE INDEX runs_owner_idx ON runs (owner, created_at);

-- Append-only, gap-free trace: seq comes from runs.last_seq, bumped under the fence.
CREATE TABLE run_events (
    run_id  uuid NOT NULL REFERENCES runs (id),
    seq     integer NOT NULL CHECK (seq >= 1),
    type    text NOT NULL CHECK (type IN (
                'run.queued', 'run.claimed', 'step.started', 'step.progress', 'step.finished',
                'effect.reserved', 'effect.settled', 'output.published', 'run.rescued',
                'run.cancel_requested', 'run.succeeded', 'run.failed', 'run.cancelled',
                'run.expired', 'run.abandoned', 'run.policy_blocked')),
    at      timestamptz NOT NULL DEFAULT now(),
    attempt integer NOT NULL CHECK (attempt >= 0),
    fence   bigint NOT NULL DEFAULT 0,
    step    text,
    data    jsonb NOT NULL DEFAULT '{}',
    PRIMARY KEY (run_id, seq)
);

-- One reserved external effect, under the fence of the attempt that reserved it.
-- state: reserved (moved out by the same worker: settled, failed, ambiguous; or by the rescuer:
-- ambiguous when the worker vanished with a mutation in flight).
CREATE TABLE effects (
    id             uuid PRIMARY KEY,
    run_id         uuid NOT NULL REFERENCES runs (id),
    fence          bigint NOT NULL,
    attempt        integer NOT NULL,
    step           text NOT NULL,
    kind           text NOT NULL CHECK (kind IN ('model_call', 'http_call')),
    mutation       boolean NOT NULL DEFAULT true,
    target         text NOT NULL,
    request_digest text NOT NULL,
    state          text NOT NULL DEFAULT 'reserved' CHECK (state IN ('reserved', 'settled', 'ambiguous', 'failed')),
    usage          jsonb,
    error_code     text,
    created_at     timestamptz NOT NULL DEFAULT now(),
    settled_at     timestamptz,
    CONSTRAINT effects_settled_iff_final CHECK ((state = 'reserved') = (settled_at IS NULL)),
    UNIQUE (run_id, fence, step)
);
CREATE INDEX effects_run_idx ON effects (run_id, state);

-- Idempotency keys seen per webhook schedule; pruned after 24 h.
CREATE TABLE webhook_receipts (
    schedule_id     uuid NOT NULL REFERENCES schedules (id),
    idempotency_key text NOT NULL,
    request_digest  text NOT NULL,
    occurrence_id   uuid NOT NULL REFERENCES occurrences (id),
    run_id          uuid NOT NULL REFERENCES runs (id),
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (schedule_id, idempotency_key)
);
CREATE INDEX webhook_receipts_created_idx ON webhook_receipts (created_at);

-- Immutability of the records that say what happened.
CREATE FUNCTION kairos_refuse_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% rows are immutable', TG_TABLE_NAME USING ERRCODE = 'restrict_violation';
END;
$$;
CREATE TRIGGER occurrences_immutable BEFORE UPDATE ON occurrences
    FOR EACH ROW EXECUTE FUNCTION kairos_refuse_update();
CREATE TRIGGER run_events_immutable BEFORE UPDATE ON run_events
    FOR EACH ROW EXECUTE FUNCTION kairos_refuse_update();
