"""Schedule request canonicalization and validation (pure: no database).

Every refusal must name the field and a stable rule, so a model can correct one request.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from kairos import agents, calendar, errors, schedules
from kairos.errors import KairosError, LimitExceeded, ValidationFailed
from kairos.states import Mode, ScheduleKind

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)  # a Tuesday
CID = str(uuid.uuid4())
OPENAI = {"executor": "openai", "model": "m", "base_url": "https://llm.example/v1",
          "api_key_secret": "env:OPENAI_API_KEY", "max_tokens": 1024}


OWNER = "alice"
# The signing secret is one of alice's own (kairos/alice/…); OPENAI's key is shared for llm.example.
HOOK_SECRET = "arn:aws:secretsmanager:us-east-1:123456789012:secret:kairos/alice/hook-AbCdEf"


@pytest.fixture(autouse=True)
def shared_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAIROS_SHARED_SECRETS", "env:OPENAI_API_KEY@llm.example,env:k@llm.example")
    monkeypatch.delenv("KAIROS_SECRET_PREFIX", raising=False)


def parse(raw: Any, *, now: datetime) -> schedules.ScheduleRequest:
    return schedules.parse_request(raw, owner=OWNER, now=now)


def body(**fields: Any) -> dict[str, Any]:
    return {"conversation_id": CID, "prompt": "say hello", **fields}


def refusal(raw: Any) -> KairosError:
    with pytest.raises(KairosError) as info:
        parse(raw, now=NOW)
    return info.value


def pairs(error: KairosError) -> set[tuple[str, str]]:
    return {(f.field, f.rule) for f in error.fields}


# --- canonicalization --------------------------------------------------------------------------


def test_daily_utc_cron_becomes_a_fixed_86400_s_interval() -> None:
    out = schedules.canonicalize(body(cron="30 7 * * *"))
    assert out["kind"] == "interval"
    assert out["interval_seconds"] == 86_400
    assert out["starts_at"] == "1970-01-01T07:30:00Z"
    assert "cron" not in out


def test_daily_utc_cron_requests_converge_on_one_representation() -> None:
    a = parse(body(cron="30 7 * * *"), now=NOW)
    b = parse(body(cron=" 30  07 * * * ", kind="cron", timezone="UTC"), now=NOW + timedelta(days=9))
    assert (a.kind, a.cron, a.interval_seconds, a.starts_at) == (b.kind, b.cron, b.interval_seconds, b.starts_at)
    # ...and it still fires every day at 07:30 UTC.
    fires = calendar.fires(schedules.rule_of(a), NOW, 3)
    assert [f.fire_at for f in fires] == [datetime(2030, 1, d, 7, 30, tzinfo=UTC) for d in (2, 3, 4)]


@pytest.mark.parametrize(
    "raw",
    [
        body(cron="30 7 * * *", timezone="Europe/Berlin"),  # not UTC
        body(cron="30 7 * * 1-5"),  # not daily
        body(cron="*/30 7 * * *"),  # not plain numbers
        body(cron="30 7 * * *", starts_at="2030-02-01T00:00:00Z"),  # an explicit start is kept as asked
        body(cron="30 24 * * *"),  # out of range: left for the calendar to refuse
    ],
)
def test_other_crons_stay_cron(raw: dict[str, Any]) -> None:
    out = schedules.canonicalize(raw)
    assert out["kind"] == "cron"
    assert out["cron"] == raw["cron"]


def test_every_seconds_becomes_an_interval() -> None:
    out = schedules.canonicalize(body(every_seconds=3600))
    assert (out["kind"], out["interval_seconds"]) == ("interval", 3600)
    assert "every_seconds" not in out
    request = parse(body(every_seconds=3600), now=NOW)
    assert request.kind is ScheduleKind.INTERVAL
    assert request.starts_at == NOW  # the anchor defaults to now


def test_every_seconds_is_not_guessed_next_to_other_rule_fields() -> None:
    assert pairs(refusal(body(kind="cron", cron="0 * * * *", every_seconds=3600))) == {
        ("every_seconds", "unknown_field")
    }
    assert ("every_seconds", "unknown_field") in pairs(refusal(body(interval_seconds=600, every_seconds=3600)))


def test_starts_at_alone_means_once() -> None:
    request = parse(body(starts_at="2030-01-02T08:00:00+01:00"), now=NOW)
    assert request.kind is ScheduleKind.ONCE
    assert request.starts_at == datetime(2030, 1, 2, 7, 0, tzinfo=UTC)


def test_cron_starts_at_is_the_earliest_fire() -> None:
    request = parse(body(cron="0 * * * *", starts_at="2030-03-01T00:30:00Z"), now=NOW)
    assert schedules.next_fire_at(schedules.rule_of(request), NOW) == datetime(2030, 3, 1, 1, 0, tzinfo=UTC)


def test_cron_without_kind_means_cron() -> None:
    request = parse(body(cron="0 7 * * 1-5", timezone="Europe/Berlin"), now=NOW)
    assert (request.kind, request.cron, request.timezone) == (ScheduleKind.CRON, "0 7 * * 1-5", "Europe/Berlin")


def test_canonicalize_does_not_change_its_input() -> None:
    raw = body(cron="30 7 * * *")
    copy = dict(raw)
    schedules.canonicalize(raw)
    assert raw == copy


# --- accepted ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        body(cron="*/5 * * * *"),
        body(kind="interval", interval_seconds=300),
        body(kind="webhook", signing={"scheme": "github", "secret": HOOK_SECRET}),
        body(kind="webhook", signing={"scheme": "standard",
                                      "secret": HOOK_SECRET.replace("us-east-1", "eu-west-1"),
                                      "tolerance_seconds": 600}),
        body(cron="0 7 * * 1-5", timezone="Europe/Berlin", dst_gap="skip", dst_fold="both", overlap="queue_one",
             catch_up=True, max_occurrences=3, ends_at="2031-01-01T00:00:00Z"),
        body(mode="fresh", agent=OPENAI, cron="0 * * * *"),
        body(kind="once", starts_at="2030-01-01T12:00:01Z"),
        body(cron="0 7 * * *", timezone="Europe/Berlin", starts_at="2030-03-01T00:00:00Z"),  # earliest fire
    ],
)
def test_accepted(raw: dict[str, Any]) -> None:
    request = parse(raw, now=NOW)
    assert request.prompt == "say hello"


def test_agent_and_signing_are_normalized() -> None:
    request = parse(body(mode="fresh", agent={"executor": "echo"}, cron="0 * * * *"), now=NOW)
    assert request.agent == {"executor": "echo"}
    hook = parse(body(kind="webhook", signing={"scheme": "github", "secret": HOOK_SECRET}), now=NOW)
    assert hook.signing == {"scheme": "github", "secret": HOOK_SECRET, "tolerance_seconds": 300}


# --- refused -----------------------------------------------------------------------------------

PAST = (NOW - timedelta(hours=1)).isoformat()


@pytest.mark.parametrize(
    ("raw", "kind", "field", "rule"),
    [
        # the calendar's judgement
        (body(cron="0 7 * * *", timezone="Mars/Olympus"), ValidationFailed, "timezone", "known_zone"),
        (body(cron="0 0 7 * * *"), ValidationFailed, "cron", "five_fields"),
        (body(cron="0 7 * * MON#2"), ValidationFailed, "cron", "cron_syntax"),
        (body(kind="interval", interval_seconds=600, starts_at="2030-02-01T00:00:00Z",
              ends_at="2030-01-15T00:00:00Z"), ValidationFailed, "ends_at", "after_starts_at"),
        (body(kind="cron"), ValidationFailed, "cron", "required"),
        (body(kind="interval"), ValidationFailed, "interval_seconds", "required"),
        (body(kind="interval", interval_seconds=600, cron="0 * * * *"), ValidationFailed, "cron", "not_for_kind"),
        # server fields are refused, not ignored
        (body(cron="0 * * * *", owner="mallory"), ValidationFailed, "owner", "unknown_field"),
        (body(cron="0 * * * *", revision=7), ValidationFailed, "revision", "unknown_field"),
        (body(cron="0 * * * *", status="active"), ValidationFailed, "status", "unknown_field"),
        (body(cron="0 * * * *", state="queued"), ValidationFailed, "state", "unknown_field"),
        (body(cron="0 * * * *", fence=1), ValidationFailed, "fence", "unknown_field"),
        (body(kind="webhook", token_hash="ab" * 32), ValidationFailed, "token_hash", "unknown_field"),
        (body(cron="0 * * * *", next_fire_at=PAST), ValidationFailed, "next_fire_at", "unknown_field"),
        # frequency limits over the real sequence
        (body(cron="*/1 * * * *"), LimitExceeded, "cron", "min_interval"),
        (body(cron="0,1 * * * *"), LimitExceeded, "cron", "min_interval"),
        (body(cron="*/4 * * * *"), LimitExceeded, "cron", "min_interval"),
        (body(kind="interval", interval_seconds=60), LimitExceeded, "interval_seconds", "min_interval"),
        (body(every_seconds=299), LimitExceeded, "interval_seconds", "min_interval"),
        # agents: references only, declared fields only
        (body(mode="fresh", cron="0 * * * *", agent={**OPENAI, "api_key_secret": "sk-live-abcdef0123456789"}),
         ValidationFailed, "agent.api_key_secret", "secret_reference"),
        (body(mode="fresh", cron="0 * * * *", agent={**OPENAI, "api_key": "sk-live-abcdef0123456789"}),
         ValidationFailed, "agent.api_key", "unknown_field"),
        (body(mode="fresh", cron="0 * * * *", agent={**OPENAI, "max_tokens": 9000}),
         ValidationFailed, "agent.max_tokens", "max"),
        (body(mode="fresh", cron="0 * * * *", agent={**OPENAI, "max_tokens": 0}),
         ValidationFailed, "agent.max_tokens", "min"),
        (body(mode="fresh", cron="0 * * * *", agent={**OPENAI, "base_url": "ftp://llm.example"}),
         ValidationFailed, "agent.base_url", "url"),
        (body(mode="fresh", cron="0 * * * *", agent={**OPENAI, "base_url": "https://u:p@llm.example"}),
         ValidationFailed, "agent.base_url", "url"),
        (body(mode="fresh", cron="0 * * * *", agent={"model": "m"}), ValidationFailed, "agent.executor", "required"),
        (body(mode="fresh", cron="0 * * * *", agent={"executor": "gpt"}), ValidationFailed, "agent.executor", "enum"),
        (body(mode="fresh", cron="0 * * * *", agent={"executor": "openai", "model": "m"}),
         ValidationFailed, "agent.base_url", "required"),
        (body(mode="fresh", cron="0 * * * *", agent="echo"), ValidationFailed, "agent", "type"),
        (body(cron="0 * * * *", agent=OPENAI), ValidationFailed, "agent", "not_for_kind"),
        # enums
        (body(kind="weekly"), ValidationFailed, "kind", "enum"),
        (body(cron="0 * * * *", mode="copy"), ValidationFailed, "mode", "enum"),
        (body(cron="0 * * * *", overlap="replace"), ValidationFailed, "overlap", "enum"),
        (body(cron="0 * * * *", dst_gap="later"), ValidationFailed, "dst_gap", "enum"),
        (body(cron="0 * * * *", dst_fold="second"), ValidationFailed, "dst_fold", "enum"),
        # required fields, types and bounds
        ({"prompt": "x", "cron": "0 * * * *"}, ValidationFailed, "conversation_id", "required"),
        ({"conversation_id": CID, "cron": "0 * * * *"}, ValidationFailed, "prompt", "required"),
        (body(cron="0 * * * *", conversation_id="not-a-uuid"), ValidationFailed, "conversation_id", "type"),
        (body(cron="0 * * * *", prompt="   "), ValidationFailed, "prompt", "empty"),
        (body(cron="0 * * * *", prompt="é" * 9000), ValidationFailed, "prompt", "max_length"),
        (body(cron="0 * * * *", name="n" * 201), ValidationFailed, "name", "max_length"),
        (body(kind="interval", interval_seconds="3600"), ValidationFailed, "interval_seconds", "type"),
        (body(kind="interval", interval_seconds=3600.0), ValidationFailed, "interval_seconds", "type"),
        (body(kind="interval", interval_seconds=0), ValidationFailed, "interval_seconds", "min"),
        (body(cron="0 * * * *", catch_up="yes"), ValidationFailed, "catch_up", "type"),
        (body(cron="0 * * * *", max_occurrences=0), ValidationFailed, "max_occurrences", "min"),
        (body(cron="0 * * * *", timezone=1), ValidationFailed, "timezone", "type"),
        # times
        (body(kind="once", starts_at=PAST), ValidationFailed, "starts_at", "not_future"),
        (body(kind="once", starts_at=NOW.isoformat()), ValidationFailed, "starts_at", "not_future"),
        (body(kind="once", starts_at="2030-02-01T08:00:00"), ValidationFailed, "starts_at", "timezone_aware"),
        (body(kind="once", starts_at="next tuesday"), ValidationFailed, "starts_at", "type"),
        (body(kind="once", starts_at=1893456000), ValidationFailed, "starts_at", "type"),
        (body(kind="once"), ValidationFailed, "starts_at", "required"),
        (body(cron="0 * * * *", ends_at=PAST), ValidationFailed, "ends_at", "not_future"),
        (body(kind="once", starts_at="2030-02-01T00:00:00Z", ends_at="2030-03-01T00:00:00Z"),
         ValidationFailed, "ends_at", "not_for_kind"),
        (body(cron="0 0 30 2 *"), ValidationFailed, "cron", "fires_never"),
        (body(cron="0 0 1 1 *", ends_at="2030-06-01T00:00:00Z"), ValidationFailed, "ends_at", "no_future_fire"),
        # fields that do not apply to the kind
        (body(kind="webhook", cron="0 * * * *"), ValidationFailed, "cron", "not_for_kind"),
        (body(kind="webhook", max_occurrences=3), ValidationFailed, "max_occurrences", "not_for_kind"),
        (body(kind="webhook", timezone="Nowhere/Land"), ValidationFailed, "timezone", "known_zone"),
        (body(cron="0 * * * *", signing={"scheme": "github", "secret": HOOK_SECRET}),
         ValidationFailed, "signing", "not_for_kind"),
        # signing: references only
        (body(kind="webhook", signing={"scheme": "github", "secret": "hunter2hunter2"}),
         ValidationFailed, "signing.secret", "secret_reference"),
        (body(kind="webhook", signing={"scheme": "svix", "secret": HOOK_SECRET}),
         ValidationFailed, "signing.scheme", "enum"),
        (body(kind="webhook", signing={"scheme": "github", "secret": HOOK_SECRET, "tolerance_seconds": 0}),
         ValidationFailed, "signing.tolerance_seconds", "min"),
        (body(kind="webhook", signing={"scheme": "github", "secret": HOOK_SECRET, "tolerance_seconds": 3601}),
         ValidationFailed, "signing.tolerance_seconds", "max"),
        (body(kind="webhook", signing={"scheme": "github", "secret": HOOK_SECRET, "algo": "sha1"}),
         ValidationFailed, "signing.algo", "unknown_field"),
        (body(kind="webhook", signing={"scheme": "github"}), ValidationFailed, "signing.secret", "required"),
        # not an object at all
        (["not", "an", "object"], ValidationFailed, "body", "type"),
    ],
)
def test_refused(raw: Any, kind: type[KairosError], field: str, rule: str) -> None:
    error = refusal(raw)
    assert type(error) is kind
    assert (field, rule) in pairs(error), error.fields
    assert all(f.message for f in error.fields)


def test_every_problem_is_reported_at_once() -> None:
    error = refusal(
        {"conversation_id": CID, "prompt": "", "kind": "interval", "interval_seconds": "3600", "owner": "x",
         "mode": "fresh", "agent": {"executor": "openai", "api_key_secret": "sk-live-abcdef"}}
    )
    assert pairs(error) >= {
        ("prompt", "empty"),
        ("interval_seconds", "type"),
        ("owner", "unknown_field"),
        ("agent.api_key_secret", "secret_reference"),
        ("agent.model", "required"),
        ("agent.base_url", "required"),
    }


def test_refusals_never_echo_a_literal_secret() -> None:
    secret = "sk-live-abcdef0123456789"
    error = refusal(body(mode="fresh", cron="0 * * * *", agent={**OPENAI, "api_key_secret": secret}))
    hook = refusal(body(kind="webhook", signing={"scheme": "github", "secret": secret}))
    assert secret not in str(error.as_body())
    assert secret not in str(hook.as_body())


def test_limit_is_reported_only_for_an_otherwise_valid_request() -> None:
    error = refusal(body(cron="*/1 * * * *", owner="x"))
    assert isinstance(error, ValidationFailed)
    assert pairs(error) == {("owner", "unknown_field")}


# --- the agent model on its own ------------------------------------------------------------------


@pytest.mark.parametrize(
    "reference",
    ["env:OPENAI_API_KEY", "env:k", "arn:aws:secretsmanager:eu-west-1:123456789012:secret:kairos/alice/llm-AbC123",
     "arn:aws-us-gov:secretsmanager:us-gov-west-1:123456789012:secret:kairos/alice/x"],
)
def test_secret_references_accepted(reference: str) -> None:
    agent = agents.validate({**OPENAI, "api_key_secret": reference}, owner=OWNER)
    assert agent["api_key_secret"] == reference


@pytest.mark.parametrize(
    "literal",
    ["sk-abc", "env:", "env:1ABC", "ENV:KEY", "arn:aws:s3:::bucket", "arn:aws:secretsmanager:eu-west-1:1:secret:x"],
)
def test_secret_literals_refused(literal: str) -> None:
    with pytest.raises(ValidationFailed) as info:
        agents.validate({**OPENAI, "api_key_secret": literal}, owner=OWNER)
    assert pairs(info.value) == {("agent.api_key_secret", "secret_reference")}


def test_validate_agent_drops_unset_fields() -> None:
    assert agents.validate({"executor": "echo", "model": None}, owner=OWNER) == {"executor": "echo"}
    assert agents.validate(OPENAI, owner=OWNER) == OPENAI


def test_mode_default_is_fork() -> None:
    assert parse(body(cron="0 * * * *"), now=NOW).mode is Mode.FORK


# --- all at once, one vocabulary, bounded instants (issue 10) ------------------------------------


def test_a_refused_shape_still_reports_the_cron_and_the_timezone() -> None:
    """A bad mode used to hide the cron and zone problems behind it: three round trips for one body."""
    error = refusal(body(mode="copy", cron="0 25 * * *", timezone="Mars/Olympus"))
    assert type(error) is ValidationFailed
    assert pairs(error) == {("mode", "enum"), ("cron", "cron_syntax"), ("timezone", "known_zone")}
    also = refusal(body(kind="weekly", cron="0/x * * * *", timezone="EST", starts_at="2030-01-01T00:00:00"))
    assert pairs(also) >= {("kind", "enum"), ("cron", "cron_syntax"), ("timezone", "known_zone"),
                           ("starts_at", "timezone_aware")}


@pytest.mark.parametrize(("value", "rule"), [
    ("9999-12-31T23:59:59-01:00", "max"),  # overflowed converting to UTC: a 500
    ("0001-01-01T00:00:00+01:00", "min"),
    ("9000-01-01T00:00:01Z", "max"),
    ("1969-12-31T23:59:59Z", "min"),
])
@pytest.mark.parametrize("field", ["starts_at", "ends_at"])
def test_instants_outside_the_sane_range_name_the_field(field: str, value: str, rule: str) -> None:
    raw = body(kind="once", starts_at=value) if field == "starts_at" else body(cron="0 * * * *", ends_at=value)
    error = refusal(raw)
    assert type(error) is ValidationFailed
    assert (field, rule) in pairs(error), error.fields


def test_the_calendar_bounds_instants_the_same_way() -> None:
    far = datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone(timedelta(hours=-1)))
    rule = calendar.Rule(ScheduleKind.ONCE, starts_at=far)
    with pytest.raises(ValidationFailed) as info:
        calendar.check_rule(rule)
    assert pairs(info.value) == {("starts_at", "max")}


@pytest.mark.parametrize("cron", ["0/15 * * * *", "5/10 * * * *", "0 16/3 * * *", "0 9 1/7 jan/3 mon/2"])
def test_start_with_a_step_crons_are_accepted(cron: str) -> None:
    request = parse(body(cron=cron, timezone="Europe/Berlin"), now=NOW)
    assert request.cron == cron


def test_a_start_with_a_step_too_frequent_is_refused_by_the_limit_not_the_syntax() -> None:
    error = refusal(body(cron="0/1 * * * *"))
    assert type(error) is LimitExceeded
    assert pairs(error) == {("cron", "min_interval")}


def test_one_table_names_pydantic_errors_for_the_api_and_the_library() -> None:
    """The API's request validation and the library's models translate the same pydantic error to the
    same rule (the API said 'range' and 'timezone_required' where the library said 'min' and
    'timezone_aware')."""
    from pydantic import AwareDatetime, BaseModel, Field, ValidationError

    from kairos.api import errors as api_errors

    class Probe(BaseModel):
        low: int = Field(ge=1)
        high: int = Field(le=10)
        at: AwareDatetime
        word: str = Field(max_length=3)

    with pytest.raises(ValidationError) as info:
        Probe.model_validate({"low": 0, "high": 11, "at": "2030-01-01T00:00:00", "word": "long", "x": 1})
    library = [(f.field, f.rule) for f in errors.from_validation_error(info.value)]
    as_powertools = [{**e, "loc": ("body", *e["loc"])} for e in info.value.errors()]
    api = [(f.field, f.rule) for f in api_errors.translate(as_powertools)]
    assert api == library
    assert dict(library) == {"low": "min", "high": "max", "at": "timezone_aware", "word": "max_length"}


def test_library_checks_use_the_vocabulary_too() -> None:
    schedule = schedules.Schedule(
        id=uuid.uuid4(), owner=OWNER, conversation_id=uuid.UUID(CID), name="", prompt="p",
        kind=ScheduleKind.CRON, cron="0 * * * *", interval_seconds=None, starts_at=None, ends_at=None,
        max_occurrences=None, timezone="UTC", dst_gap=calendar.DstGap.AUTO, dst_fold=calendar.DstFold.AUTO,
        mode=Mode.FORK, catch_up=False, overlap=schedules.Overlap.ALLOW, agent=None, signing=None,
        status=schedules.ScheduleStatus.ACTIVE, revision=1, next_fire_at=None, last_fire_at=None, fire_count=0,
        consecutive_failures=0)
    for count, rule in ((0, "min"), (101, "max")):
        with pytest.raises(ValidationFailed) as info:
            schedules.preview(schedule, after=NOW, count=count)
        assert pairs(info.value) == {("count", rule)}
    with pytest.raises(ValidationFailed) as info:
        schedules.preview(schedule, after=datetime(1, 1, 1, 0, 0, tzinfo=timezone(timedelta(hours=1))), count=3)
    assert pairs(info.value) == {("after", "min")}
