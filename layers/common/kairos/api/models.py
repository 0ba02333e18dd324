"""The HTTP API's request and response models: one source for validation and the OpenAPI document.

Request bodies are strict (``extra="forbid"``): a field the route does not declare — ``owner``,
``state``, ``fence``, ``revision``, token hashes, anything — is refused with ``rule="unknown_field"``,
never ignored. The schedule body is the strict ``kairos.schedules.ScheduleRequest``; it is read raw
first so the chat-style shorthand can be canonicalized before that strict validation.

Response models name the fields each envelope guarantees; the objects inside (a schedule, a run, an
event) come from their own modules' ``as_json()`` and may carry more fields (``extra="allow"``), so
the document never promises less than the body holds. Times are RFC 3339 strings in UTC.
Limits are the library's own (``conversations.TITLE_MAX``, ``secrets.VALUE_MAX_BYTES``, the token
overlap of ``schedules``, ``goals.policy``'s goal and count caps, ``input_requests.ANSWER_MAX``), never a
second copy: ``tests/unit/test_api_model_limits.py`` compares each bound with its constant. Limits
written only in a description (``secrets.VALUE_MAX_BYTES``, a loop's horizon) are checked by the library,
not by the model. Nothing here talks to the database.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kairos import conversations, input_requests, schedules, secrets
from kairos.schedules import loop_policy
from kairos.schedules.request import PAUSE_REASON_MAX
from kairos.states import StepState


# defer_build: a model's validator is built at its first use, not at import — a cold start builds only
# the models of the route it serves (the OpenAPI document builds the rest when it is asked for).
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", defer_build=True)


# ---- requests ------------------------------------------------------------------------------------


class ConversationCreate(_Strict):
    """``POST /v1/conversations``: an agent (validated by ``agents.validate``) and a title."""

    agent: dict[str, Any] = Field(description="executor, model, system, base_url, api_key_secret, max_tokens")
    title: str | None = Field(default=None, max_length=conversations.TITLE_MAX)


class SecretPut(_Strict):
    """``PUT /v1/secrets/{name}``: the key itself. It is stored in Secrets Manager, never returned."""

    value: str = Field(min_length=1, description=f"the key; at most {secrets.VALUE_MAX_BYTES:,} bytes (UTF-8)")


class TokenRotate(_Strict):
    """``POST /v1/schedules/{id}/token``: how long the previous token keeps working."""

    overlap_seconds: int = Field(default=schedules.TOKEN_OVERLAP_DEFAULT_SECONDS, ge=0,
                                 le=schedules.TOKEN_OVERLAP_MAX_SECONDS)


class TestRunRequest(_Strict):
    """``POST /v1/schedules/{id}/test``: the payload the test run sees (a webhook schedule's delivery)."""

    payload: Any = Field(default=None, description="any JSON, at most 65,536 bytes; the run's payload")


class PauseRequest(_Strict):
    """``POST /v1/schedules/{id}/pause``: why, shown with the schedule as ``paused_reason`` until it resumes."""

    reason: str | None = Field(default=None, max_length=PAUSE_REASON_MAX)


class RetryRequest(_Strict):
    """``POST /v1/runs/{id}/retry``: from the start (no body, or no ``from``) or from the last step."""

    from_: Literal["last_step"] | None = Field(
        default=None, alias="from",
        description="last_step: the new run takes over the old run's completed steps (never sent again) and "
                    "continues after them")


# ---- responses -----------------------------------------------------------------------------------


class FieldProblem(_Strict):
    field: str
    rule: str
    message: str


class ErrorInfo(_Strict):
    code: str
    message: str
    fields: list[FieldProblem]


class ErrorBody(_Strict):
    """Every error, on every route: ``{"error": {"code", "message", "fields": [...]}}``."""

    error: ErrorInfo


class Webhook(_Strict):
    url: str
    token: str = Field(description="shown once; only its SHA-256 is stored")


class LastRunOut(_Strict):
    id: str
    state: str
    source: str
    created_at: str
    finished_at: str | None


class ScheduleOut(_Open):
    id: str
    conversation_id: str
    kind: str
    status: str
    revision: int
    last_run: LastRunOut | None = Field(description="the schedule's newest run; null before its first")
    limits: dict[str, int] | None = Field(default=None, description="runtime_seconds, max_attempts, max_steps, "
                                          "rate_per_minute (webhook): the limits it sets; null: none")


class ScheduleEnvelope(_Strict):
    schedule: ScheduleOut


class ScheduleCreated(_Strict):
    schedule: ScheduleOut
    webhook: Webhook | None = Field(default=None, description="only for kind: webhook")


class TokenRotated(_Strict):
    schedule: ScheduleOut
    webhook: Webhook


class SecretOut(_Strict):
    name: str
    reference: str = Field(description="give this as agent.api_key_secret or signing.secret")
    updated_at: str


class SecretEnvelope(_Strict):
    secret: SecretOut


class SecretList(_Strict):
    secrets: list[SecretOut]


class ScheduleList(_Strict):
    schedules: list[ScheduleOut]


class FireOut(_Strict):
    fire_at: str = Field(description="UTC instant, RFC 3339")
    dispatch_at: str | None = Field(default=None, description=(
        "when the fire is dispatched: fire_at plus its stable jitter offset in [0, jitter_seconds] (fire_at "
        "without jitter); lateness and expiry count from it. A preview and an occurrence always carry it"))
    local_time: str = Field(description="wall time in the schedule's zone, ISO 8601 without offset")
    utc_offset: str = Field(description="offset at fire_at, e.g. +02:00")
    fold: int = Field(ge=0, le=1)


class FireList(_Strict):
    fires: list[FireOut]


class HookAccepted(_Strict):
    run_id: str
    occurrence_id: str


class BackfillOccurrence(FireOut):
    id: str
    schedule_revision: int = Field(description="the revision whose rule made the instant (the run executes it)")
    decision: str
    run_id: str | None


class BackfillAccepted(_Strict):
    occurrences: list[BackfillOccurrence] = Field(
        description="the window's backfill occurrences, oldest first (made by this request or an earlier one)")


class UsageDay(_Strict):
    day: str = Field(description="UTC day, YYYY-MM-DD")
    input_tokens: int
    output_tokens: int
    cost_usd: float = Field(description="at KAIROS_MODEL_PRICES")
    calls: int = Field(description="model calls that answered")
    runs: int = Field(description="runs with at least one model call that answered that day")


class UsageDays(_Strict):
    days: list[UsageDay] = Field(description="every day of the window, oldest first (zeros without usage)")


class RunOut(_Open):
    id: str
    state: str
    conversation_id: str | None = Field(description="the thread the run wrote to (a fork's or fresh run's own "
                                                    "conversation); null until it is claimed")
    retry_of: str | None = Field(description="the run a POST /v1/runs/{id}/retry made this one from; null "
                                             "for any other run")
    resumed_from: int | None = Field(description="a retry from the last step: the number of the last of the old "
                                                 "run's steps it took over (0: none); null for any other run")
    schedule_revision: int | None = Field(
        default=None, description="the schedule revision the run executed; null for a chat turn (and runs "
                                  "recorded before it was kept)")
    agent_digest: str | None = Field(
        default=None, description="SHA-256 hex of the canonical agent JSON the run used (sorted keys, compact, "
                                  "UTF-8; secret references, never values)")
    limits: dict[str, int] | None = Field(
        default=None, description="runtime_seconds, max_attempts, max_steps: the limits the run was recorded with")
    waiting_for: Literal["slot", "key"] | None = Field(
        default=None, description="a queued run waiting in the database: for one of its owner's running slots, or "
                                  "for its concurrency key's; null for any other run")


class RunEnvelope(_Strict):
    run: RunOut


class TestRunAccepted(_Strict):
    run_id: str
    occurrence_id: str
    run: RunOut = Field(description="the test run (source test, test true), queued")


class ApprovalOut(_Open):
    id: str
    run_id: str
    state: str
    tool: str


class ApprovalEnvelope(_Strict):
    approval: ApprovalOut


class ApprovalList(_Strict):
    approvals: list[ApprovalOut]


class LoopGoal(_Strict):
    """A loop's goal: what its runs work toward (``kairos.schedules.loop_policy.Goal``)."""

    outcome: str = Field(min_length=1, max_length=loop_policy.OUTCOME_MAX)
    constraints: list[str] = Field(default_factory=list, max_length=loop_policy.CONSTRAINTS_MAX)
    verification: str | None = Field(default=None, max_length=loop_policy.VERIFICATION_MAX,
                                     description="how a run checks the outcome; shown back only as a digest")


class LoopCreate(_Strict):
    """``POST /v1/loops`` (documented shape; the route reads the body raw so a field that would loosen a
    loop's fixed policies is named with rule ``loop_policy``). Always catch-up off, overlap skip, mode
    append, no backfill; ``ends_at`` at most 90 days ahead and ``max_occurrences`` at most 500, both required."""

    conversation_id: str
    goal: LoopGoal
    prompt: str | None = None
    name: str | None = None
    cron: str | None = None
    interval_seconds: int | None = None
    starts_at: str | None = None
    timezone: str = "UTC"
    ends_at: str
    max_occurrences: int = Field(ge=1, le=loop_policy.MAX_OCCURRENCES)


class InputAnswer(_Strict):
    """``POST /v1/input-requests/{id}/answer``: the owner's answer, appended to the run's thread."""

    answer: str = Field(min_length=1, max_length=input_requests.ANSWER_MAX)


class InputRequestOut(_Open):
    id: str
    run_id: str
    loop_id: str
    state: str
    question: str


class InputRequestAnswered(_Strict):
    input_request: InputRequestOut
    run_id: str


class InputRequestList(_Strict):
    input_requests: list[InputRequestOut]


_NEXT = "pass as `before` for the next page; null: this page is the last"


class RunList(_Strict):
    runs: list[RunOut]
    next_before: str | None = Field(description=_NEXT)


class OccurrenceOut(_Open):
    id: str
    source: str
    fire_at: str = Field(description="UTC instant, RFC 3339")
    dispatch_at: str = Field(description="fire_at plus the fire's jitter offset (fire_at without jitter); lateness "
                                         "and a scheduled run's expiry count from it")
    local_time: str = Field(description="wall time in the schedule's zone, ISO 8601 without offset")
    utc_offset: str
    fold: int = Field(ge=0, le=1)
    schedule_revision: int
    decision: str
    covers_from: str | None
    covers_until: str | None
    covers_count: int
    run_id: str | None = Field(description="the run this occurrence produced; null when it made none")


class OccurrenceList(_Strict):
    occurrences: list[OccurrenceOut]
    next_before: str | None = Field(description=_NEXT)


class EventOut(_Open):
    seq: int
    type: str


class EventPage(_Strict):
    events: list[EventOut]
    next_after: int


class StepTarget(_Strict):
    method: str
    host: str
    path: str


class StepOut(_Strict):
    step: int = Field(description="1, 2, … within the run, across attempts")
    attempt: int
    kind: Literal["model", "tool"]
    name: str = Field(description="the model id or the tool's name")
    state: StepState
    started_at: str
    finished_at: str | None
    input: Any = Field(description="redacted preview, at most 4 KiB; larger is {truncated, bytes, sha256, head}")
    output: Any = Field(description="redacted preview, at most 4 KiB; larger is {truncated, bytes, sha256, head}")
    target: StepTarget | None = Field(description="where an outbound call went")
    usage: dict[str, Any] | None = Field(description="tokens, cost and duration of the step's call")
    effect_id: str | None
    pruned_at: str | None = Field(description="set when retention forgot the previews")


class StepPage(_Strict):
    steps: list[StepOut]
    next_after: int = Field(description="the last listed step: pass it as after for the next page")


class OutputOut(_Open):
    state: Literal["available", "empty", "unavailable"]
    schedule_revision: int | None = Field(default=None, description="as the run's: the revision that produced it")
    agent_digest: str | None = Field(default=None, description="as the run's: the agent JSON that produced it")


class OutputEnvelope(_Strict):
    output: OutputOut


class EntryOut(_Open):
    seq: int
    role: str
    content: str


class ConversationOut(_Open):
    id: str
    entries: list[EntryOut]


class ConversationEnvelope(_Strict):
    conversation: ConversationOut


class ConversationSummary(_Open):
    id: str
    title: str | None
    parent_id: str | None = Field(description="the conversation a fork or a run thread continues")
    fork_seq: int | None
    created_at: str
    agent: dict[str, Any] = Field(description="executor and model only")


class ConversationList(_Strict):
    conversations: list[ConversationSummary]
    next_before: str | None = Field(description=_NEXT)


class NoteOut(_Open):
    kind: str


class Inbox(_Strict):
    notes: list[NoteOut]


class Empty(_Strict):
    """No body (204)."""


class StatusOut(_Open):
    now: str
    due_backlog: int = Field(description="your active schedules whose next fire has passed")
    fire_lag_seconds: float = Field(description="how long the oldest of them has waited (0 without any)")
    queued: int
    running: int
    dlq_depth: int | None = Field(description="messages in the run queue's dead-letter queue; null when unknown")


class StatusEnvelope(_Strict):
    status: StatusOut


class OpenApiDocument(_Open):
    openapi: str
    paths: dict[str, Any]


class CorpusOut(_Open):
    phase: str
    coverage: dict[str, int]
    partitions: dict[str, int]
    exports: list[dict[str, Any]]


class CorpusEnvelope(_Strict):
    corpus: CorpusOut


class CorpusRecordOut(_Open):
    kind: str
    id: str
    data: dict[str, Any]
    lineage: dict[str, Any]


class CorpusRecordPage(_Strict):
    records: list[CorpusRecordOut]
    next_after: str | None
    pruned_at: str | None = Field(default=None, description="set once retention deleted the run's records")
