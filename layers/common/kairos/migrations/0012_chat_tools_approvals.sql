-- Agents that act (tools, approvals and budgets): chat turns, the tool loop's step
-- log, and approval waits.

-- Chat turns: a turn posted to a conversation is an occurrence and a run of no schedule. Every other
-- source belongs to a schedule.
ALTER TABLE occurrences ALTER COLUMN schedule_id DROP NOT NULL;
ALTER TABLE occurrences DROP CONSTRAINT occurrences_source_check;
ALTER TABLE occurrences ADD CONSTRAINT occurrences_source_check
    CHECK (source IN ('scheduled', 'manual', 'backfill', 'webhook', 'chat'));
ALTER TABLE occurrences ADD CONSTRAINT occurrences_schedule_iff_not_chat
    CHECK ((schedule_id IS NULL) = (source = 'chat'));

ALTER TABLE runs ALTER COLUMN schedule_id DROP NOT NULL;
ALTER TABLE runs DROP CONSTRAINT runs_source_check;
ALTER TABLE runs ADD CONSTRAINT runs_source_check
    CHECK (source IN ('scheduled', 'manual', 'backfill', 'webhook', 'chat'));
ALTER TABLE runs ADD CONSTRAINT runs_schedule_iff_not_chat CHECK ((schedule_id IS NULL) = (source = 'chat'));
CREATE INDEX runs_conversation_chat_idx ON runs (source_conversation_id, created_at) WHERE source = 'chat';

-- The run states and trace event types the design names, all of them (approval and input waits,
-- deferrals, corpus phases): later features use them without another rewrite of these lists.
ALTER TABLE runs DROP CONSTRAINT runs_state_check;
ALTER TABLE runs ADD CONSTRAINT runs_state_check CHECK (state IN (
    'queued', 'running', 'awaiting_approval', 'awaiting_input',
    'succeeded', 'failed', 'cancelled', 'expired', 'abandoned', 'policy_blocked'));

ALTER TABLE run_events DROP CONSTRAINT run_events_type_check;
ALTER TABLE run_events ADD CONSTRAINT run_events_type_check CHECK (type IN (
    'run.queued', 'run.claimed', 'step.started', 'step.progress', 'step.finished',
    'effect.reserved', 'effect.settled', 'output.published', 'run.rescued', 'run.cancel_requested',
    'run.deferred', 'approval.waiting', 'approval.approved', 'approval.denied', 'input.waiting',
    'input.answered', 'corpus.phase', 'corpus.partition', 'run.paused', 'run.resumed',
    'run.succeeded', 'run.failed', 'run.cancelled', 'run.expired', 'run.abandoned', 'run.policy_blocked'));

-- A tool call is an effect too (the schedules tool writes here; the http tool calls out).
ALTER TABLE effects DROP CONSTRAINT effects_kind_check;
ALTER TABLE effects ADD CONSTRAINT effects_kind_check CHECK (kind IN ('model_call', 'http_call', 'tool_call'));

-- The step log: each completed step of a run's tool loop (a model turn with its reply or tool calls,
-- a tool call with its result), bounded, written under the run's fence in the transaction that
-- settles the step's effect. A later attempt (after an approval, a rescue or a retry-safe failure)
-- folds these instead of calling again. Append-only like the trace; the retention pruner may delete.
CREATE TABLE run_steps (
    run_id     uuid NOT NULL REFERENCES runs (id),
    n          integer NOT NULL CHECK (n >= 1),
    kind       text NOT NULL CHECK (kind IN ('model', 'tool')),
    name       text NOT NULL,
    call_id    text,
    record     jsonb NOT NULL,
    attempt    integer NOT NULL,
    fence      bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, n)
);
CREATE TRIGGER run_steps_no_update BEFORE UPDATE ON run_steps
    FOR EACH ROW EXECUTE FUNCTION kairos_refuse_update();
CREATE TRIGGER run_steps_no_delete BEFORE DELETE ON run_steps
    FOR EACH STATEMENT EXECUTE FUNCTION kairos_refuse_delete();

-- Approval waits: one request per tool call that needs a person, bound to the run, the attempt that
-- asked, the tool and the canonical digest of its arguments. pending -> approved (consumed once by
-- the resumed attempt: applied) | denied | expired | retired (the run was cancelled).
CREATE TABLE approvals (
    id          uuid PRIMARY KEY,
    run_id      uuid NOT NULL REFERENCES runs (id),
    owner       text NOT NULL CHECK (owner <> ''),
    state       text NOT NULL DEFAULT 'pending'
                CHECK (state IN ('pending', 'approved', 'applied', 'denied', 'expired', 'retired')),
    attempt     integer NOT NULL,
    step        integer NOT NULL,
    call_id     text NOT NULL,
    tool        text NOT NULL,
    args_digest text NOT NULL,
    preview     jsonb NOT NULL,
    expires_at  timestamptz NOT NULL,
    decided_at  timestamptz,
    decided_by  text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT approvals_decided CHECK ((state = 'pending') = (decided_at IS NULL)),
    UNIQUE (run_id, step, call_id)
);
CREATE INDEX approvals_owner_idx ON approvals (owner, state, created_at DESC);
CREATE INDEX approvals_pending_expiry_idx ON approvals (expires_at) WHERE state = 'pending';

-- The settle step marks ended chat turns settled (they have no schedule to account to).
CREATE INDEX runs_unsettled_chat_idx ON runs (finished_at)
    WHERE schedule_id IS NULL AND finished_at IS NOT NULL AND settled_at IS NULL;
