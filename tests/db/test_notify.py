"""Deliver (docs/architecture.md "Schedules and time"): a schedule's ``notify`` reports run endings — an inbox note per
matching run, written when the tick settles it, and a Standard Webhooks POST sent by the tick's deliver
step from the ``notify_deliveries`` outbox, retried with backoff, once per run as far as the receiver
can tell (``webhook-id`` = the run id). Real PostgreSQL, a real local HTTP server as the receiver.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from kairos import secrets
from kairos.db import Database
from kairos.tick import Deliver, Settle
from tests import factories
from tests.support.aws import SqsQueue
from tests.support.peer import Peer, Received, closed_port, resolver_to

T = datetime(2026, 3, 2, 7, 0, tzinfo=UTC)
KEY = b"0123456789abcdef0123456789abcdef"
SECRET = "whsec_" + base64.b64encode(KEY).decode()
ALICE_REF = "arn:aws:secretsmanager:us-east-1:123456789012:secret:kairos/alice/hook-AbC123"
BOB_REF = "arn:aws:secretsmanager:us-east-1:123456789012:secret:kairos/bob/hook-AbC123"
LOCAL = ("127.0.0.1",)


def alice_secret(reference: str, *, owner: str, audience: str | None) -> str:
    """Secrets Manager for alice's one hook key (the real check runs first, as ``secrets.resolve`` does)."""
    try:
        secrets.check(reference, owner=owner, audience=audience)
    except secrets.Refused as refused:
        raise secrets.SecretUnavailable(f"refused ({refused.rule})") from None
    assert reference == ALICE_REF and audience is None
    return SECRET


def scripted(*statuses: int) -> Any:
    """Answers each POST with the next status (the last one repeats)."""
    left = list(statuses)

    def behaviour(handler: BaseHTTPRequestHandler, peer: Peer) -> None:
        status = left.pop(0) if len(left) > 1 else left[0]
        handler.send_response(status)
        handler.send_header("Content-Length", "2")
        handler.end_headers()
        handler.wfile.write(b"ok")

    return behaviour


@pytest.fixture
def receiver() -> Iterator[Peer]:
    with Peer(scripted(500, 500, 200)) as peer:
        yield peer


def rows(url: str, query: str, *args: Any) -> list[dict[str, Any]]:
    with psycopg.connect(url, row_factory=dict_row) as conn:
        return conn.execute(query, args).fetchall()


def hooked(url: str, target: str, *, on: tuple[str, ...] = ("failed",), secret: str = ALICE_REF,
           **columns: Any) -> dict[str, Any]:
    return factories.schedule(url, notify={"on": list(on), "webhook": {"url": target, "secret": secret}}, **columns)


def ended(url: str, sched: dict[str, Any], state: str = "failed", minute: int = 0, **columns: Any) -> dict[str, Any]:
    return factories.run(url, schedule_row=sched, state=state, fire_at=T + timedelta(minutes=minute),
                         finished_at=T + timedelta(minutes=minute, seconds=30), **columns)


def settle(db: Database, queue: SqsQueue, now: datetime = T) -> Any:
    return Settle(db, queue.client, queue.url).run_once(now=now)


def deliver(db: Database, *, allow: tuple[str, ...] = LOCAL, **kw: Any) -> Deliver:
    kw.setdefault("secret", alice_secret)
    return Deliver(db, allow=allow, **kw)


def delivery(url: str, run_id: Any) -> dict[str, Any]:
    (row,) = rows(url, "SELECT * FROM notify_deliveries WHERE run_id = %s", run_id)
    return row


def notes(url: str, sched: dict[str, Any]) -> list[dict[str, Any]]:
    return rows(url, "SELECT kind, body FROM inbox_notes WHERE conversation_id = %s ORDER BY id",
                sched["conversation_id"])


def verified(received: Received) -> bool:
    """The Standard Webhooks signature, recomputed here from the key (not with the library's signer)."""
    h = received.headers
    signed = f"{h['webhook-id']}.{h['webhook-timestamp']}.".encode() + received.body
    expected = "v1," + base64.b64encode(hmac.new(KEY, signed, hashlib.sha256).digest()).decode()
    return hmac.compare_digest(expected, h["webhook-signature"])


# ---- the receiver's view -----------------------------------------------------------------------


def test_a_receiver_that_fails_twice_then_accepts_sees_one_delivery_id_and_is_never_sent_it_again(
        db: Database, db_url: str, sqs_queue: SqsQueue, receiver: Peer) -> None:
    sched = hooked(db_url, receiver.url("/hook"))
    run = ended(db_url, sched)
    assert settle(db, sqs_queue).deliveries == 1
    d = deliver(db)

    assert d.run_once(now=T).retried == 1  # 500
    assert d.run_once(now=T + timedelta(seconds=29)).attempted == 0, "backing off: 30 s after the first failure"
    assert d.run_once(now=T + timedelta(seconds=31)).retried == 1  # 500
    assert d.run_once(now=T + timedelta(seconds=80)).attempted == 0, "then 60 s"
    assert d.run_once(now=T + timedelta(seconds=100)).delivered == 1  # 200

    assert len(receiver.received) == 3
    assert {r.headers["webhook-id"] for r in receiver.received} == {str(run["id"])}
    assert all(verified(r) for r in receiver.received)
    assert {r.body for r in receiver.received} == {receiver.received[0].body}
    assert json.loads(receiver.received[0].body) == {"type": "run.failed", "run_id": str(run["id"]),
                                                     "schedule_id": str(sched["id"])}
    row = delivery(db_url, run["id"])
    assert (row["state"], row["attempts"], row["last_status"], row["last_error"]) == ("delivered", 3, 200, None)
    assert row["finished_at"] is not None

    # Accepted once: never sent again, however many ticks follow and however late.
    for later in (T + timedelta(minutes=5), T + timedelta(days=2)):
        assert d.run_once(now=later).attempted == 0
    assert settle(db, sqs_queue, T + timedelta(hours=1)).deliveries == 0
    assert len(receiver.received) == 3


def test_410_gone_gives_up_at_once_and_other_4xx_are_retried(db: Database, db_url: str,
                                                             sqs_queue: SqsQueue) -> None:
    with Peer(scripted(410)) as gone, Peer(scripted(404, 400, 204)) as flaky:
        first = hooked(db_url, gone.url("/gone"))
        second = hooked(db_url, flaky.url("/flaky"))
        gone_run, flaky_run = ended(db_url, first), ended(db_url, second)
        settle(db, sqs_queue)
        d = deliver(db)
        report = d.run_once(now=T)
        assert (report.attempted, report.gave_up, report.retried) == (2, 1, 1)
        for minute in (1, 3):
            d.run_once(now=T + timedelta(minutes=minute))
        assert (len(gone.received), len(flaky.received)) == (1, 3)

    row = delivery(db_url, gone_run["id"])
    assert (row["state"], row["attempts"], row["last_status"]) == ("gave_up", 1, 410)
    assert delivery(db_url, flaky_run["id"])["state"] == "delivered"
    gave_up = [n for n in notes(db_url, first) if n["kind"] == "notify_gave_up"]
    assert [n["body"]["run_id"] for n in gave_up] == [str(gone_run["id"])]
    assert gave_up[0]["body"]["last_status"] == 410
    assert [n["kind"] for n in notes(db_url, second)] == ["run_ended"]


def test_retries_stop_after_24_hours_with_one_note(db: Database, db_url: str, sqs_queue: SqsQueue) -> None:
    with Peer(scripted(503)) as down:
        sched = hooked(db_url, down.url("/down"))
        run = ended(db_url, sched)
        settle(db, sqs_queue)
        d = deliver(db)
        assert d.run_once(now=T).retried == 1
        # The next wait (60 s) would end after created_at + 24 h: this attempt is the last.
        last = d.run_once(now=T + timedelta(hours=23, minutes=59, seconds=30))
        assert (last.attempted, last.gave_up) == (1, 1)
        assert d.run_once(now=T + timedelta(days=3)).attempted == 0
        assert len(down.received) == 2
    row = delivery(db_url, run["id"])
    assert (row["state"], row["attempts"], row["last_status"]) == ("gave_up", 2, 503)
    assert row["last_error"] == "http_status: the receiver answered 503"
    assert [n["kind"] for n in notes(db_url, sched)] == ["run_ended", "notify_gave_up"]


def test_the_backoff_doubles_and_is_capped() -> None:
    from kairos.notify import backoff_seconds

    assert [backoff_seconds(n) for n in (1, 2, 3, 4, 7, 8, 50)] == [30, 60, 120, 240, 1920, 3600, 3600]


def test_two_concurrent_ticks_never_send_one_delivery_at_the_same_time(db: Database, db_url: str,
                                                                        sqs_queue: SqsQueue) -> None:
    arrived = threading.Event()

    def slow(handler: BaseHTTPRequestHandler, peer: Peer) -> None:
        arrived.set()
        peer.release.wait(30)  # the test releases it once the second tick has looked
        handler.send_response(200)
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    with Peer(slow) as peer:
        sched = hooked(db_url, peer.url("/slow"))
        run = ended(db_url, sched)
        settle(db, sqs_queue)
        reports: list[Any] = []
        first = threading.Thread(target=lambda: reports.append(deliver(db).run_once(now=T)))
        first.start()
        assert arrived.wait(10), "the first tick's request reached the receiver"
        # While the first tick waits for the answer, other ticks find nothing to send.
        assert deliver(db).run_once(now=T).attempted == 0
        assert deliver(db).run_once(now=T + timedelta(minutes=2)).attempted == 0
        peer.release.set()
        first.join(30)
        assert reports[0].delivered == 1
        assert deliver(db).run_once(now=T + timedelta(hours=1)).attempted == 0
        assert len(peer.received) == 1
    assert delivery(db_url, run["id"])["state"] == "delivered"


def test_a_succeeded_run_sends_a_bounded_preview_of_its_answer(db: Database, db_url: str,
                                                               sqs_queue: SqsQueue) -> None:
    conversation = factories.conversation(db_url, entries=[("assistant", "é" * 5_000)])
    with Peer(scripted(200)) as peer:
        sched = hooked(db_url, peer.url("/ok"), on=("succeeded",), conversation_id=conversation["id"])
        run = ended(db_url, sched, "succeeded")
        settle(db, sqs_queue)
        assert deliver(db).run_once(now=T).delivered == 1
        body = json.loads(peer.received[0].body)
    assert body == {"type": "run.succeeded", "run_id": str(run["id"]), "schedule_id": str(sched["id"]),
                    "output": "é" * 1_000}


# ---- the inbox ---------------------------------------------------------------------------------


def test_one_note_per_matching_run_and_none_for_other_states(db: Database, db_url: str,
                                                             sqs_queue: SqsQueue) -> None:
    chosen = factories.schedule(db_url, notify={"on": ["failed", "succeeded"]})
    default = factories.schedule(db_url)  # the column's default: every unhappy end
    runs = {(s["id"], state): ended(db_url, s, state, minute)
            for s in (chosen, default)
            for minute, state in enumerate(["failed", "succeeded", "cancelled", "expired", "abandoned"])}
    assert settle(db, sqs_queue).notes == 5
    assert settle(db, sqs_queue).notes == 0  # each run is reported once

    def reported(sched: dict[str, Any]) -> list[tuple[str, str | None]]:
        found = []
        for note in notes(db_url, sched):
            assert note["kind"] == "run_ended"
            body = note["body"]
            assert body["run_id"] == str(runs[(sched["id"], body["state"])]["id"])
            assert body["schedule_id"] == str(sched["id"])
            found.append((body["state"], body["reason_code"]))
        return found

    assert reported(chosen) == [("failed", "peer_error"), ("succeeded", None)]
    assert reported(default) == [("failed", "peer_error"), ("expired", None), ("abandoned", "peer_error")]
    assert rows(db_url, "SELECT run_id FROM notify_deliveries") == []  # no webhook, nothing owed


# ---- refusals are recorded, never raised -------------------------------------------------------


def test_the_egress_check_refuses_a_disallowed_target_and_the_delivery_records_why(
        db: Database, db_url: str, sqs_queue: SqsQueue, receiver: Peer) -> None:
    literal = hooked(db_url, receiver.url("/hook"))
    named = hooked(db_url, "https://hooks.example.com/kairos")
    dead = hooked(db_url, f"http://127.0.0.1:{closed_port()}/hook")
    literal_run, named_run, dead_run = ended(db_url, literal), ended(db_url, named), ended(db_url, dead)
    settle(db, sqs_queue)

    # Nothing is allowed to reach loopback, and the name points at a private address.
    report = deliver(db, allow=(), resolve=resolver_to("10.1.2.3")).run_once(now=T)
    assert report.attempted == 3 and receiver.received == []
    refused = delivery(db_url, literal_run["id"])
    assert refused["state"] == "gave_up" and refused["last_error"].startswith("egress_refused: ")
    unreachable = delivery(db_url, named_run["id"])  # a name may resolve elsewhere later: retried
    assert unreachable["state"] == "pending" and unreachable["last_error"].startswith("connect_failed: ")
    assert "10.1.2.3" not in unreachable["last_error"]
    closed = delivery(db_url, dead_run["id"])
    assert closed["state"] == "gave_up" and closed["last_error"].startswith("egress_refused: ")


def test_a_refused_connection_is_retried(db: Database, db_url: str, sqs_queue: SqsQueue) -> None:
    sched = hooked(db_url, f"http://127.0.0.1:{closed_port()}/hook")
    run = ended(db_url, sched)
    settle(db, sqs_queue)
    assert deliver(db).run_once(now=T).retried == 1
    row = delivery(db_url, run["id"])
    assert row["state"] == "pending" and row["last_error"].startswith("connect: ") and row["last_status"] is None


def test_a_reference_edited_in_the_database_signs_nothing(db: Database, db_url: str, sqs_queue: SqsQueue,
                                                          receiver: Peer) -> None:
    sched = hooked(db_url, receiver.url("/hook"))
    run = ended(db_url, sched)
    settle(db, sqs_queue)
    rows(db_url, "UPDATE notify_deliveries SET secret_ref = %s RETURNING run_id", BOB_REF)
    # The real resolver: it checks the owner's namespace before any Secrets Manager call.
    assert deliver(db, secret=secrets.resolve).run_once(now=T).gave_up == 1
    assert receiver.received == []
    assert delivery(db_url, run["id"])["last_error"].startswith("secret_unavailable: ")


def test_the_secret_never_appears_in_rows_or_logs(db: Database, db_url: str, sqs_queue: SqsQueue,
                                                  receiver: Peer, caplog: pytest.LogCaptureFixture) -> None:
    from tests.support.logs import powertools_output

    sched = hooked(db_url, receiver.url("/hook?token=in-the-path"))
    run = ended(db_url, sched)
    with powertools_output() as out, caplog.at_level("DEBUG"):
        settle(db, sqs_queue)
        d = deliver(db)
        for minute in (0, 1, 3):
            d.run_once(now=T + timedelta(minutes=minute))
    assert delivery(db_url, run["id"])["state"] == "delivered"
    logged = out.getvalue() + caplog.text
    assert '"action":"notify_delivered"' in logged.replace(" ", "")
    dumped = json.dumps([rows(db_url, f"SELECT * FROM {table}")  # every row, as text
                         for table in ("schedules", "notify_deliveries", "inbox_notes", "runs")], default=str)
    for clear in (SECRET, SECRET.removeprefix("whsec_"), KEY.decode()):
        assert clear not in logged and clear not in dumped
    assert "in-the-path" not in logged, "receivers put tokens in URLs: the URL is not logged"
    assert ALICE_REF in dumped  # the reference, never the value
    for received in receiver.received:
        assert SECRET not in json.dumps(received.headers) and KEY not in received.body


def test_the_tick_delivers_after_the_fires_and_only_while_time_is_left(db: Database, db_url: str,
                                                                      sqs_queue: SqsQueue, receiver: Peer) -> None:
    from kairos.tick import Tick

    sched = hooked(db_url, receiver.url("/hook"))
    ended(db_url, sched)
    tick = Tick(db, sqs_queue.client, sqs_queue.url, metrics=None, egress_allow=LOCAL)
    tick.deliver = deliver(db)
    short = tick.run(lambda: 0)  # no time left: settles (notes are part of settling), sends nothing
    assert short.stopped_for_time and short.notes == 1 and receiver.received == []
    assert tick.run().notify_retried == 1 and len(receiver.received) == 1  # the 500 of the script
