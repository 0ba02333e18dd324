"""Diagnoses: the closed lists of reason codes and recovery actions, and what an ended run says about why.

Role: the one home of the rules a failed, cancelled or refused run is explained by — ``REASON_CODES``
(what an executor's failure or the worker's own ending may be called), ``RUN_REASON_CODES`` (the run
machinery's endings: the claim's refusals and the tick's give-up), ``RECOVERY_ACTIONS``, the fixed
scope, retry eligibility, actions and plain-language summary per code (``diagnose``), and the
summaries the tick's rescuer gives a run whose worker stopped (``rescued``).

Guarantees: a diagnosis only ever carries a known reason code and actions from the closed list;
``retry_run`` is offered only when the run is retry-eligible, and never on a goal loop's run (a loop
fires its own next run; the retry route refuses one: ``for_loop_run``). Summaries are written for the owner
and carry no provider text, prompt or secret.

Must not: import anything above the foundation (the executors, the worker and the tick import it,
so it stays free of the run machinery and cheap for the tick's cold start); touch the database.
"""

from __future__ import annotations

from typing import Any, Literal

# The closed list of failure reasons an executor's error (``ExecutorError``), the worker and the tick's
# rescuer may give; ``diagnose`` accepts these and ``RUN_REASON_CODES``.
REASON_CODES: frozenset[str] = frozenset(
    {
        "agent_invalid",  # the agent config cannot be executed
        "egress_refused",  # the target host is not allowed (metadata, link-local, private)
        "secret_unavailable",  # api_key_secret could not be resolved
        "connect_failed",  # nothing was sent
        "timeout",  # sent, no answer in time: outcome unknown
        "peer_error",  # the peer answered with an error status
        "rate_limited",  # the peer answered 429
        "malformed_reply",  # the peer answered something we cannot read
        "reply_too_large",  # the peer's answer exceeded the bound
        "unstorable_reply",  # a model's answer holds what the database cannot store (NUL, NaN, a huge count)
        "input_too_large",  # the system prompt and the run's prompt alone exceed max_input_tokens
        "ambiguous_effect",  # a mutation whose outcome cannot be proven
        "runtime_limit",  # the run exceeded its runtime limit
        "lease_lost",  # another worker holds the run now
        "restart_limit",  # rescued too often
        "abandoned_late",  # catch-up off: not delivered late
        "cancelled",  # cancellation requested
        "step_limit",  # the tool loop used its max_steps model turns without a final answer
        "approved_call_not_applied",  # the approved tool call could not be applied as approved
        "budget_exhausted",  # the owner's daily token or cost ceiling left no room for the call
        "internal",  # a bug on our side
    }
)


# The closed list of recovery actions a diagnosis may offer (the tick uses resume_schedule).
RECOVERY_ACTIONS: frozenset[str] = frozenset(
    {
        "retry_run",
        "resume_schedule",
        "check_agent_config",
        "check_secret",
        "check_egress_allow",
        "check_target",
        "raise_runtime_limit",
        "raise_max_steps",
        "report_issue",
    }
)

# Each recovery action's executable form (docs/api.md "Diagnoses"): the route that performs it, or the
# route and the field of its body to change (``field``: a dotted path into the PATCH body, e.g.
# ``limits.runtime_seconds``). ``{run_id}`` and ``{schedule_id}`` are the run's; ``with_actions`` fills
# them in. tests/unit/test_recovery_actions.py holds each to a route of the API and a field its body takes.
ACTION_ROUTES: dict[str, dict[str, str]] = {
    "retry_run": {"method": "POST", "path": "/v1/runs/{run_id}/retry"},
    "resume_schedule": {"method": "POST", "path": "/v1/schedules/{schedule_id}/resume"},
    "check_agent_config": {"method": "PATCH", "path": "/v1/schedules/{schedule_id}", "field": "agent"},
    "check_secret": {"method": "PATCH", "path": "/v1/schedules/{schedule_id}", "field": "agent.api_key_secret"},
    "check_egress_allow": {"method": "PATCH", "path": "/v1/schedules/{schedule_id}", "field": "agent.base_url"},
    "check_target": {"method": "PATCH", "path": "/v1/schedules/{schedule_id}", "field": "agent.base_url"},
    "raise_runtime_limit": {"method": "PATCH", "path": "/v1/schedules/{schedule_id}",
                            "field": "limits.runtime_seconds"},
    "raise_max_steps": {"method": "PATCH", "path": "/v1/schedules/{schedule_id}", "field": "limits.max_steps"},
    # What to attach to a report: the run's trace.
    "report_issue": {"method": "GET", "path": "/v1/runs/{run_id}/events"},
}
Scope = Literal["run", "step", "target"]

# reason_code -> (scope, retry eligible, recovery actions, plain-language summary). Summaries are
# written for the owner and carry no provider text, prompt or secret.
_DIAGNOSES: dict[str, tuple[Scope, bool, tuple[str, ...], str]] = {
    "agent_invalid": ("target", False, ("check_agent_config",), "The agent configuration cannot be executed."),
    "egress_refused": ("target", False, ("check_agent_config", "check_egress_allow"),
                       "The agent's endpoint is not an allowed destination."),
    # Not retry-eligible (docs/api.md "Credentials"): the reference is refused or names nothing until the
    # owner fixes it; a Secrets Manager outage is retried on the same run without this entry's say.
    "secret_unavailable": ("target", False, ("check_secret",),
                           "The agent's API key could not be read, or the agent may not use it."),
    "connect_failed": ("target", True, ("retry_run", "check_target"),
                       "The agent's endpoint could not be reached; nothing was sent."),
    "timeout": ("step", True, ("retry_run", "check_target"), "The agent's endpoint did not answer in time."),
    "peer_error": ("target", True, ("retry_run", "check_target"), "The agent's endpoint answered with an error."),
    "rate_limited": ("target", True, ("retry_run",), "The agent's endpoint is rate limiting requests."),
    "malformed_reply": ("step", True, ("retry_run", "check_agent_config"),
                        "The agent's endpoint answered something that is not a usable reply."),
    "reply_too_large": ("step", False, ("check_agent_config",), "The agent's reply exceeded the size limit."),
    # Not retry-eligible: the model answered (and was paid for); the same input tends to the same answer.
    "unstorable_reply": ("step", False, ("check_agent_config", "check_target"),
                         "The model's reply held something that cannot be stored (a NUL character, a number "
                         "that is not finite, or an impossible token count), so the run stopped at once."),
    "input_too_large": ("step", False, ("check_agent_config",),
                        "The run's prompt and the agent's system prompt alone exceed the agent's input limit."),
    "ambiguous_effect": ("step", False, ("check_target",),
                         "An external call may or may not have taken effect, so the run is not replayed."),
    "runtime_limit": ("run", False, ("raise_runtime_limit", "check_target"),
                      "The run exceeded its runtime limit (the schedule's limits.runtime_seconds)."),
    "lease_lost": ("run", True, ("retry_run",), "The worker lost its lease on the run."),
    "restart_limit": ("run", True, ("retry_run",), "The run was interrupted and restarted too often."),
    "abandoned_late": ("run", False, (), "The run was interrupted and is not delivered late (catch-up is off)."),
    "cancelled": ("run", False, (), "The run was cancelled."),
    "internal": ("run", True, ("retry_run", "report_issue"), "The run failed because of an internal error."),
    # Not retried automatically (the day's budget does not come back within a retry's delay); a manual
    # retry on a later UTC day, or after the ceiling is raised, may run.
    "budget_exhausted": ("run", True, ("retry_run",),
                         "The owner's daily token or cost budget has no room for this model call; nothing "
                         "was sent. Retry on a later day (UTC) or ask for a higher ceiling."),
    # The run machinery's own endings (RUN_REASON_CODES): the claim's refusals and the tick's give-up.
    "schedule_paused": ("run", False, ("resume_schedule",),
                        "The run was not started: its schedule is paused."),
    "schedule_cancelled": ("run", False, (), "The run was not started: its schedule was cancelled."),
    "superseded": ("run", False, (), "The run was not started: a newer fire of its schedule had already started."),
    "expired": ("run", False, (), "The run was not started in time: it waited past its expiry (catch-up is off), "
                                  "so it is not delivered late."),
    "undeliverable": ("run", True, ("retry_run", "report_issue"),
                      "The run was handed to the queue five times and no worker claimed it."),
    "step_limit": ("run", False, ("raise_max_steps", "check_agent_config"),
                   "The agent kept calling tools and reached its max_steps (the schedule's limits.max_steps) "
                   "without a final answer."),
    "approved_call_not_applied": ("step", False, (), "The approved tool call could not be applied as approved."),
    "approval_denied": ("step", False, (), "A tool call of the run needed approval and was denied."),
    "approval_expired": ("step", False, (), "A tool call of the run needed approval and nobody decided in time."),
    "replaced": ("run", False, (), "The run was cancelled: a newer fire of its schedule replaced it "
                                   "(overlap cancel_replace)."),
    # Corpus runs (kairos.corpus).
    "corpus_no_partition_succeeded": ("run", False, ("check_agent_config",),
                                      "No partition of the corpus produced valid records, so nothing was "
                                      "exported."),
    "corpus_source_unavailable": ("target", True, ("retry_run", "check_target"),
                                  "The corpus source could not be listed or read."),
    "corpus_source_refused": ("target", False, ("check_agent_config",),
                              "The corpus source is not one this owner may read: its bucket is not allowed, "
                              "or its prefix is outside the owner's namespace (<owner>/)."),
    "corpus_export_unavailable": ("target", True, ("retry_run", "report_issue"),
                                  "The corpus export could not be written to the export bucket."),
    "not_replace_safe": ("run", False, (),
                         "The run was not started: the run it should have replaced had already reserved an "
                         "external change, so replacing it is not safe (overlap cancel_replace)."),
    # Goal loops (kairos.schedules.loops).
    "goal_report_missing": ("run", False, ("check_agent_config",),
                            "The loop run ended without calling goal_report with its disposition."),
    "goal_revised": ("run", False, ("resume_schedule",),
                     "The run was not started: its loop's goal was edited after it was made, so it would work "
                     "toward a goal that no longer stands."),
}

# Reasons only the run machinery gives (the claim's refusals, the tick's repair), beside the
# executors' REASON_CODES; ``diagnose`` accepts both.
RUN_REASON_CODES: frozenset[str] = frozenset(
    {"schedule_paused", "schedule_cancelled", "superseded", "expired", "undeliverable", "replaced",
     "not_replace_safe", "approval_denied", "approval_expired", "corpus_no_partition_succeeded",
     "corpus_source_unavailable", "corpus_source_refused", "corpus_export_unavailable", "goal_report_missing",
     "goal_revised"}
)
def diagnose(
    reason_code: str,
    *,
    summary: str | None = None,
    retry_eligible: bool | None = None,
    scope: Scope | None = None,
) -> dict[str, Any]:
    """The closed diagnosis of an ended run for one reason code of ``REASON_CODES`` or
    ``RUN_REASON_CODES``."""
    if reason_code not in REASON_CODES and reason_code not in RUN_REASON_CODES:
        raise ValueError(f"unknown reason code {reason_code}")
    default_scope, default_eligible, actions, default_summary = _DIAGNOSES[reason_code]
    eligible = default_eligible if retry_eligible is None else retry_eligible
    return {
        "summary": summary or default_summary,
        "scope": scope or default_scope,
        "reason_code": reason_code,
        "retry_eligible": eligible,
        "recovery_actions": [a for a in actions if eligible or a != "retry_run"],
    }


def with_actions(diagnosis: dict[str, Any], *, run_id: object, schedule_id: object | None) -> dict[str, Any]:
    """``diagnosis`` as the API shows it: beside ``recovery_actions`` (the names), ``actions``, each one's
    executable form for this run (``{"action", "method", "path"[, "field"]}``). An action whose route
    needs a schedule is left out of ``actions`` for a run without one (a chat turn)."""
    forms = []
    for action in diagnosis.get("recovery_actions") or []:
        route = ACTION_ROUTES.get(action)
        if route is None or ("{schedule_id}" in route["path"] and schedule_id is None):
            continue
        path = route["path"].format(run_id=run_id, schedule_id=schedule_id)
        forms.append({"action": action, **route, "path": path})
    return {**diagnosis, "actions": forms}


def for_loop_run(diagnosis: dict[str, Any] | None) -> dict[str, Any] | None:
    """A goal loop run's diagnosis as shown: without ``retry_run``, which ``POST /v1/runs/{id}/retry``
    refuses for a loop's run (409 ``loop_policy``: the loop fires its next run on its rule)."""
    if diagnosis is None or "retry_run" not in (diagnosis.get("recovery_actions") or []):
        return diagnosis
    return {**diagnosis, "recovery_actions": [a for a in diagnosis["recovery_actions"] if a != "retry_run"]}


# What the tick's rescuer says of a run whose worker stopped (its lease expired) and that it ends
# instead of requeueing; the reason codes without an entry keep their default summary.
def rescued(reason_code: str, *, restart_limit: int) -> dict[str, Any]:
    """The diagnosis of a run the rescuer ends after its lease expired (``restart_limit``: the
    rescuer's limit, named in the summary)."""
    summaries = {
        "ambiguous_effect": "The worker stopped after an external call that may change something outside had "
                            "begun; whether it took effect is unknown, so the run is not replayed.",
        "restart_limit": f"The run's worker stopped before finishing and the run was already restarted "
                         f"{restart_limit} times; it is not restarted again.",
        "abandoned_late": "The worker running this scheduled run stopped before finishing. Catch-up is off, so "
                          "the run is not restarted late; the schedule's next fire runs as usual.",
        "cancelled": "The run was cancelled; its worker stopped before confirming.",
    }
    return diagnose(reason_code, summary=summaries.get(reason_code))
