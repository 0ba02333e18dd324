"""The operator CLI and `kairos invoke`, run in-process against a real database and moto's SQS."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest

from kairos import cli
from tests import factories
from tests.support.api import Api

ROOT = Path(__file__).resolve().parents[2]


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_status_reports_backlog_stuck_runs_and_dlq_depth(api: Api, capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    dlq = api.sqs.create_queue(QueueName="cli-dlq")["QueueUrl"]
    dlq_arn = api.sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    queue = api.sqs.create_queue(QueueName="cli-runs", Attributes={
        "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": "5"})})["QueueUrl"]
    for i in range(2):
        api.sqs.send_message(QueueUrl=dlq, MessageBody=json.dumps({"run_id": f"dead-{i}"}))
    monkeypatch.setenv("RUN_QUEUE_URL", queue)
    factories.schedule(api.url)  # due a minute ago
    factories.run(api.url, state="queued")
    stuck = factories.run(api.url, state="running")
    with psycopg.connect(api.url, autocommit=True) as conn:
        conn.execute("UPDATE runs SET lease_expires_at = now() - interval '1 minute' WHERE id = %s", (stuck["id"],))

    code, out, _ = run_cli(capsys, "status", "--json")

    assert code == 0
    status = json.loads(out)
    assert status["due_backlog"] >= 1
    assert status["queued"] == 1 and status["running"] == 1
    assert status["stuck_lease_expired"] == 1
    assert status["dlq_depth"] == 2


def test_schedules_list_show_pause_resume_cancel(api: Api, capsys: pytest.CaptureFixture[str]) -> None:
    sched = factories.schedule(api.url, owner="carol", cron="0 7 * * *")
    sid = str(sched["id"])

    code, out, _ = run_cli(capsys, "schedules", "list")
    assert code == 0 and sid in out and "carol" in out

    assert run_cli(capsys, "schedules", "pause", sid)[0] == 0
    code, out, _ = run_cli(capsys, "schedules", "show", sid, "--json")
    assert json.loads(out)["status"] == "paused"

    assert run_cli(capsys, "schedules", "resume", sid)[0] == 0
    assert run_cli(capsys, "schedules", "cancel", sid)[0] == 0
    code, out, _ = run_cli(capsys, "schedules", "list", "--json")
    assert sid not in out  # cancelled schedules are hidden unless --all
    code, out, _ = run_cli(capsys, "schedules", "list", "--all", "--json")
    assert [s["status"] for s in json.loads(out) if s["id"] == sid] == ["cancelled"]


def test_a_wrong_move_or_an_unknown_id_is_an_error_not_a_traceback(
    api: Api, capsys: pytest.CaptureFixture[str]
) -> None:
    sched = factories.schedule(api.url)
    code, _, err = run_cli(capsys, "schedules", "resume", str(sched["id"]))
    assert code == 1 and err.startswith("kairos: ")
    code, _, err = run_cli(capsys, "runs", "show", "00000000-0000-0000-0000-000000000000")
    assert code == 1 and "run not found" in err


def test_runs_list_show_trace_and_cancel(api: Api, capsys: pytest.CaptureFixture[str]) -> None:
    run = factories.run(api.url, state="queued")
    rid = str(run["id"])
    with psycopg.connect(api.url, autocommit=True) as conn:
        conn.execute("UPDATE runs SET last_seq = 1 WHERE id = %s", (run["id"],))
        conn.execute("INSERT INTO run_events (run_id, seq, type, attempt) VALUES (%s, 1, 'run.queued', 0)",
                     (run["id"],))

    code, out, _ = run_cli(capsys, "runs", "list", "--state", "queued")
    assert code == 0 and rid in out
    code, out, _ = run_cli(capsys, "runs", "trace", rid)
    assert "run.queued" in out
    code, out, _ = run_cli(capsys, "runs", "cancel", rid, "--json")
    assert code == 0 and json.loads(out)["state"] == "cancelled"
    code, out, _ = run_cli(capsys, "runs", "show", rid)
    assert "run.cancelled" in out


def test_runs_trace_and_show_json_print_the_events_as_json(api: Api, capsys: pytest.CaptureFixture[str]) -> None:
    run = factories.run(api.url, state="queued")
    rid = str(run["id"])
    with psycopg.connect(api.url, autocommit=True) as conn:
        conn.execute("UPDATE runs SET last_seq = 2 WHERE id = %s", (run["id"],))
        conn.execute("INSERT INTO run_events (run_id, seq, type, attempt, at) VALUES "
                     "(%s, 1, 'run.queued', 0, '2026-03-01T07:00:00Z')", (run["id"],))
        conn.execute("INSERT INTO run_events (run_id, seq, type, attempt, step, data, at) VALUES "
                     "(%s, 2, 'step.started', 1, 'model', '{\"n\": 1}', '2026-03-01T07:00:01.5Z')", (run["id"],))

    for verb in ("trace", "show"):
        code, out, err = run_cli(capsys, "runs", verb, rid, "--json")
        assert code == 0, err
        shown = json.loads(out)  # one JSON document, not text lines
        assert shown["run"]["id"] == rid
        assert shown["events"] == [
            {"seq": 1, "type": "run.queued", "at": "2026-03-01T07:00:00Z", "attempt": 0, "step": None, "data": {}},
            {"seq": 2, "type": "step.started", "at": "2026-03-01T07:00:01.500000Z", "attempt": 1, "step": "model",
             "data": {"n": 1}},
        ]
    code, out, _ = run_cli(capsys, "runs", "trace", rid)  # without --json: the readable lines
    assert code == 0 and "+    1.500s  step.started" in out


@pytest.mark.parametrize(
    ("function", "event", "check"),
    [
        ("webhook", "events/api_openapi.json", lambda r: r["statusCode"] == 200),
        ("tick", "events/tick.json", lambda r: "dispatched" in json.dumps(r)),
        ("run", "events/run_sqs.json", lambda r: r == {"batchItemFailures": []}),
    ],
)
def test_invoke_calls_each_handler_with_its_sample_event(api: Api, capsys: pytest.CaptureFixture[str],
                                                          function: str, event: str, check) -> None:
    code, out, _ = run_cli(capsys, "invoke", function, str(ROOT / event))
    assert code == 0
    # Handlers log JSON lines to stdout (as on Lambda); the result is the indented document after them.
    result = json.loads(out[out.index("{\n"):])
    assert check(result), out


def test_edit_trigger_backfill_and_retry_print_clean_json(api: Api, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUN_QUEUE_URL", api.queue_url)
    sched = factories.schedule(api.url, owner="carol", cron="0 7 * * *", next_fire_at=None)
    with psycopg.connect(api.url, autocommit=True) as conn:
        conn.execute("UPDATE schedules SET created_at = now() - interval '3 days' WHERE id = %s", (sched["id"],))
    sid = str(sched["id"])

    code, out, err = run_cli(capsys, "schedules", "edit", sid, "--patch", '{"prompt": "v2"}', "--if-match", "1",
                             "--json")
    assert code == 0, err
    edited = json.loads(out)  # nothing but the JSON on stdout: logs went to stderr
    assert edited["prompt"] == "v2" and edited["revision"] == 2
    code, _, err = run_cli(capsys, "schedules", "edit", sid, "--patch", '{"prompt": "v3"}', "--if-match", "1")
    assert code == 1 and "If-Match" in err

    code, out, err = run_cli(capsys, "schedules", "trigger", sid, "--json")
    assert code == 0, err
    triggered = json.loads(out)
    assert [m["run_id"] for m in api.messages()] == [triggered["run_id"]]

    code, out, err = run_cli(capsys, "schedules", "backfill", sid, "--from", "2000-01-01T00:00:00Z",
                             "--until", "2000-01-03T00:00:00Z", "--json")
    assert code == 0, err
    assert json.loads(out) == {"occurrences": []}  # before the schedule existed: nothing
    code, _, err = run_cli(capsys, "schedules", "backfill", sid, "--from", "2000-01-03T00:00:00Z",
                           "--until", "2000-01-01T00:00:00Z")
    assert code == 1 and "until: after_from" in err

    failed = factories.run(api.url, schedule_row=sched, state="failed")
    code, out, err = run_cli(capsys, "runs", "retry", str(failed["id"]), "--json")
    assert code == 0, err
    retried = json.loads(out)
    with psycopg.connect(api.url) as conn:
        row = conn.execute("SELECT retry_of FROM runs WHERE id = %s", (retried["run_id"],)).fetchone()
    assert row is not None and row[0] == failed["id"]
    code, _, err = run_cli(capsys, "runs", "retry", str(triggered["run_id"]))
    assert code == 1 and "cannot be retried" in err


def test_approvals_list_approve_and_deny(api: Api, capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUN_QUEUE_URL", api.queue_url)
    sched = factories.schedule(api.url, owner="carol")
    waiting = [factories.run(api.url, schedule_row=sched, state="awaiting_approval",
                             fire_at=datetime(2026, 1, day, tzinfo=UTC)) for day in (1, 2)]
    first, second = (factories.approval(api.url, run_row=run) for run in waiting)

    code, out, err = run_cli(capsys, "approvals", "list", "--state", "pending", "--json")
    assert code == 0, err
    assert {a["id"] for a in json.loads(out)} == {str(first["id"]), str(second["id"])}
    code, out, err = run_cli(capsys, "approvals", "approve", str(first["id"]), "--json")
    assert code == 0 and json.loads(out)["state"] == "approved", err
    assert [m["run_id"] for m in api.messages()] == [str(waiting[0]["id"])]
    code, out, err = run_cli(capsys, "approvals", "deny", str(second["id"]), "--json")
    assert code == 0 and json.loads(out)["state"] == "denied", err
    with psycopg.connect(api.url) as conn:
        states = dict(conn.execute("SELECT id, state FROM runs WHERE id = ANY(%s)",
                                   ([w["id"] for w in waiting],)).fetchall())
    assert states == {waiting[0]["id"]: "queued", waiting[1]["id"]: "policy_blocked"}
    code, _, err = run_cli(capsys, "approvals", "approve", str(second["id"]))
    assert code == 1 and "already denied" in err
    code, _, err = run_cli(capsys, "approvals", "list", "--state", "maybe")
    assert code == 1 and "state: enum" in err


def test_approvals_list_shows_each_requests_arguments(api: Api, capsys: pytest.CaptureFixture[str]) -> None:
    sched = factories.schedule(api.url, owner="carol")
    waiting = factories.run(api.url, schedule_row=sched, state="awaiting_approval")
    arguments = json.dumps({"body": {"order": 42, "note": "ünïcode"}, "url": "https://shop.example/orders"},
                           sort_keys=True, ensure_ascii=False)
    request = factories.approval(api.url, run_row=waiting, preview=json.dumps(
        {"tool": "http_post", "arguments": arguments, "truncated": True}))

    code, out, err = run_cli(capsys, "approvals", "list", "--state", "pending")

    assert code == 0, err
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(str(request["id"])))
    # the arguments' JSON text once, under the request's line (not escaped a second time), and the cut said
    assert lines[at + 1] == f"    arguments  {arguments}"
    assert lines[at + 2] == "    (cut to the preview's bound)"
    assert "\\" not in out


def test_every_remaining_command_prints_parseable_json(api: Api, capsys: pytest.CaptureFixture[str]) -> None:
    sched = factories.schedule(api.url, owner="carol", cron="0 7 * * *")
    sid = str(sched["id"])
    run = factories.run(api.url, schedule_row=sched, state="queued")
    rid = str(run["id"])

    parsed = {}
    for argv in (("schedules", "list"), ("schedules", "show", sid), ("schedules", "pause", sid),
                 ("schedules", "resume", sid), ("runs", "list"), ("runs", "show", rid), ("runs", "trace", rid),
                 ("runs", "cancel", rid), ("approvals", "list"), ("schedules", "cancel", sid), ("status",)):
        code, out, err = run_cli(capsys, *argv, "--json")
        assert code == 0, (argv, err)
        parsed[argv[:2]] = json.loads(out)
    assert parsed[("schedules", "pause")]["status"] == "paused"
    assert parsed[("schedules", "resume")]["status"] == "active"
    assert parsed[("schedules", "cancel")]["status"] == "cancelled"
    assert parsed[("runs", "show")]["run"]["id"] == rid and parsed[("runs", "trace")]["run"]["id"] == rid
    assert parsed[("runs", "cancel")]["state"] == "cancelled"
    assert [r["id"] for r in parsed[("runs", "list")]] == [rid]


def test_a_no_op_exits_non_zero_with_the_reason(api: Api, capsys: pytest.CaptureFixture[str]) -> None:
    sched = factories.schedule(api.url, owner="carol", cron="0 7 * * *")
    sid = str(sched["id"])
    run = factories.run(api.url, schedule_row=sched, state="queued")
    rid = str(run["id"])

    assert run_cli(capsys, "schedules", "pause", sid)[0] == 0
    code, out, err = run_cli(capsys, "schedules", "pause", sid, "--json")
    assert code == 1 and out == "" and "schedule is paused and cannot be paused" in err
    assert run_cli(capsys, "schedules", "cancel", sid)[0] == 0
    code, out, err = run_cli(capsys, "schedules", "cancel", sid)
    assert code == 1 and out == "" and "already cancelled" in err

    assert run_cli(capsys, "runs", "cancel", rid)[0] == 0
    code, out, err = run_cli(capsys, "runs", "cancel", rid, "--json")
    assert code == 1 and out == "" and f"run {rid} is already cancelled: nothing to cancel" in err


def test_an_invalid_state_is_exit_2_with_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["runs", "list", "--state", "bogus"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'bogus'" in err and "succeeded" in err


def test_loops_create_show_and_input_list_answer(api: Api, capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from datetime import timedelta

    monkeypatch.setenv("RUN_QUEUE_URL", api.queue_url)
    conversation = factories.conversation(api.url, owner="carol", agent={
        "executor": "openai", "model": "m", "base_url": "https://api.openai.com/v1"})
    body = {"conversation_id": str(conversation["id"]), "goal": {"outcome": "inbox zero", "verification": "secret"},
            "interval_seconds": 3600, "ends_at": (datetime.now(UTC) + timedelta(days=5)).isoformat(),
            "max_occurrences": 3}
    code, out, err = run_cli(capsys, "loops", "create", "--owner", "carol", "--body", json.dumps(body), "--json")
    assert code == 0, err
    created = json.loads(out)
    assert (created["loop"], created["status"], created["overlap"]) == (True, "active", "skip")
    code, out, err = run_cli(capsys, "loops", "show", created["id"])
    assert code == 0 and "inbox zero" in out and "secret" not in out, err
    code, _, err = run_cli(capsys, "loops", "create", "--owner", "carol", "--body",
                           json.dumps({**body, "catch_up": True}))
    assert code == 1 and "catch_up: loop_policy" in err
    plain = factories.schedule(api.url, owner="carol")
    code, _, err = run_cli(capsys, "loops", "show", str(plain["id"]))
    assert code == 1 and "loop not found" in err

    loop = factories.loop(api.url, owner="carol", conversation_id=conversation["id"])
    asking = factories.run(api.url, schedule_row=loop, state="awaiting_input", attempt=1, fence=1)
    question = factories.input_request(api.url, run_row=asking)
    code, out, err = run_cli(capsys, "input", "list", "--state", "pending", "--json")
    assert code == 0 and [r["id"] for r in json.loads(out)] == [str(question["id"])], err
    code, out, err = run_cli(capsys, "input", "answer", str(question["id"]), "--answer", "the blue one", "--json")
    assert code == 0 and json.loads(out)["state"] == "answered", err
    assert [m["run_id"] for m in api.messages()] == [str(asking["id"])]
    code, _, err = run_cli(capsys, "input", "answer", str(question["id"]), "--answer", "again")
    assert code == 1 and "already answered" in err


def test_schedules_list_and_show_carry_the_jitter_and_the_dispatch_instant(
        api: Api, capsys: pytest.CaptureFixture[str]) -> None:
    at = datetime(2030, 1, 7, 7, 0, tzinfo=UTC)
    sched = factories.schedule(api.url, owner="carol", cron="0 7 * * *", next_fire_at=at, jitter_seconds=600)
    code, out, _ = run_cli(capsys, "schedules", "list")
    assert code == 0 and f"(jitter 600s: dispatch {sched['next_dispatch_at'].isoformat()})" in out
    code, out, _ = run_cli(capsys, "schedules", "show", str(sched["id"]), "--json")
    shown = json.loads(out)
    assert shown["jitter_seconds"] == 600 and datetime.fromisoformat(shown["next_dispatch_at"]) == \
        sched["next_dispatch_at"]
