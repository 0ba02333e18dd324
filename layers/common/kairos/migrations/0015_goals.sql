-- Goals and bounded agent loops: a loop is a schedule marked `loop`
-- whose goal is part of its definition (so schedule_revisions keeps every goal), a `draft` status for
-- a loop whose goal changed, and the questions a loop run asks its owner.

-- draft: a loop whose goal was edited (out by: API resume (active) or cancel). Only a loop is ever
-- in draft.
ALTER TABLE schedules DROP CONSTRAINT schedules_status_check;
ALTER TABLE schedules ADD CONSTRAINT schedules_status_check
    CHECK (status IN ('draft', 'active', 'paused', 'cancelled', 'completed'));

-- loop: made by POST /v1/loops, never by POST /v1/schedules. goal: the goal envelope (outcome,
-- constraints, verification and their digests, bound to goal_revision); part of the definition.
-- goal_revision: the revision whose goal is in force; a run of an older revision is refused at claim.
-- input_run_id: the run a paused loop waits on (its question to the owner); the claim lets exactly
-- that run through the pause. State, not definition.
ALTER TABLE schedules
    ADD COLUMN loop boolean NOT NULL DEFAULT false,
    ADD COLUMN goal jsonb,
    ADD COLUMN goal_revision integer,
    ADD COLUMN input_run_id uuid REFERENCES runs (id);

-- The policies a loop can never loosen, held by the schema as well as by the API.
ALTER TABLE schedules ADD CONSTRAINT schedules_loop_policies CHECK (
    NOT loop OR (goal IS NOT NULL AND goal_revision IS NOT NULL AND kind IN ('cron', 'interval')
                 AND catch_up = false AND overlap = 'skip' AND mode = 'append'
                 AND ends_at IS NOT NULL AND max_occurrences IS NOT NULL AND max_occurrences <= 500));
ALTER TABLE schedules ADD CONSTRAINT schedules_goal_iff_loop CHECK ((goal IS NULL) = (NOT loop));
ALTER TABLE schedules ADD CONSTRAINT schedules_draft_is_loop CHECK (status <> 'draft' OR loop);
ALTER TABLE schedules ADD CONSTRAINT schedules_input_run_is_loop CHECK (input_run_id IS NULL OR loop);

-- The definition a revision records leaves out the waiting run (state, like the cursor).
CREATE OR REPLACE FUNCTION kairos_schedule_definition(s schedules) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT to_jsonb(s) - ARRAY['id', 'owner', 'conversation_id', 'status', 'revision', 'next_fire_at',
                               'last_fire_at', 'fire_count', 'consecutive_failures', 'token_hash',
                               'previous_token_hash', 'previous_token_expires_at', 'created_by_run_id',
                               'created_at', 'updated_at', 'input_run_id']
$$;

-- Overlap sees a run waiting for its owner's answer as active (a loop's skip policy).
DROP INDEX runs_schedule_active_idx;
CREATE INDEX runs_schedule_active_idx ON runs (schedule_id)
    WHERE state IN ('queued', 'running', 'awaiting_approval', 'awaiting_input');

-- input_requests: a loop run's question to its owner, bound to owner, run, the attempt and tool call
-- that asked, the schedule and its goal revision. pending -> answered (by the owner, once) |
-- cancelled (the run or the loop was cancelled, or the goal changed) | expired (reserved). The
-- question is member-readable (it is also in the run's thread); the answer lives in the thread only:
-- the row keeps its digest and the entry that holds it.
CREATE TABLE input_requests (
    id               uuid PRIMARY KEY,
    owner            text NOT NULL CHECK (owner <> ''),
    run_id           uuid NOT NULL REFERENCES runs (id),
    attempt          integer NOT NULL,
    step             integer NOT NULL,
    call_id          text NOT NULL,
    schedule_id      uuid NOT NULL REFERENCES schedules (id),
    revision         integer NOT NULL,
    conversation_id  uuid NOT NULL REFERENCES conversations (id),
    question         text NOT NULL CHECK (length(question) BETWEEN 1 AND 4000),
    question_digest  text NOT NULL,
    state            text NOT NULL DEFAULT 'pending'
                     CHECK (state IN ('pending', 'answered', 'cancelled', 'expired')),
    answer_digest    text,
    answer_entry_seq bigint,
    decided_at       timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT input_requests_decided CHECK ((state = 'pending') = (decided_at IS NULL)),
    CONSTRAINT input_requests_answered CHECK (
        (state = 'answered') = (answer_digest IS NOT NULL) AND (answer_digest IS NULL) = (answer_entry_seq IS NULL)),
    UNIQUE (run_id, step, call_id)
);
CREATE UNIQUE INDEX input_requests_one_pending_idx ON input_requests (run_id) WHERE state = 'pending';
CREATE INDEX input_requests_owner_idx ON input_requests (owner, state, created_at DESC);
CREATE INDEX input_requests_schedule_pending_idx ON input_requests (schedule_id) WHERE state = 'pending';
