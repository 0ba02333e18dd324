"""The handoff overlaps its SendMessageBatch calls on one bounded pool, and one chunk's failure loses no other.

Against the local SQS stand-in (``bench/sqs_standin.py``, a real HTTP server speaking SQS's JSON
protocol), which counts the calls in flight at once: overlap is what the server observes, never a
timing. The stand-in holds each call a little so that calls sent together are in flight together.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest

from kairos import handoff
from tests.support.standin import SqsStandin


@pytest.fixture
def standin() -> Iterator[SqsStandin]:
    with SqsStandin(delay_ms=30) as server:
        yield server


def test_calls_overlap_up_to_the_bound_and_never_beyond(standin: SqsStandin) -> None:
    ids = [uuid.uuid4() for _ in range(500)]  # 50 calls: a full fire batch

    result = handoff.send_batch(standin.client(), standin.queue_url, ids)

    assert sorted(result.sent) == sorted(ids) and result.failed == ()
    assert standin.stats.calls == 50 and standin.stats.entries == 500
    assert 1 < standin.stats.max_in_flight <= handoff.MAX_PARALLEL_CALLS
    assert sorted(standin.stats.accepted) == sorted(handoff.body(i) for i in ids)


def test_a_smaller_share_of_the_pool_is_respected(standin: SqsStandin) -> None:
    ids = [uuid.uuid4() for _ in range(120)]
    result = handoff.send_batch(standin.client(), standin.queue_url, ids, parallel=3)
    assert len(result.sent) == 120
    assert 1 < standin.stats.max_in_flight <= 3


def test_concurrent_sends_share_the_bound(standin: SqsStandin) -> None:
    """Two fire workers sending at once still have at most MAX_PARALLEL_CALLS calls in flight together."""
    import threading

    client = standin.client()
    batches = [[uuid.uuid4() for _ in range(300)] for _ in range(2)]
    results: list[handoff.HandoffResult] = []
    threads = [threading.Thread(target=lambda b=b: results.append(handoff.send_batch(client, standin.queue_url, b)))
               for b in batches]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r for res in results for r in res.sent) == sorted(r for b in batches for r in b)
    assert 1 < standin.stats.max_in_flight <= handoff.MAX_PARALLEL_CALLS


def test_a_failing_call_and_refused_entries_lose_no_other_chunk() -> None:
    ids = [uuid.uuid4() for _ in range(95)]
    doomed_chunk = ids[20:30]  # the third chunk: its call is answered 400
    refused = {ids[3], ids[64]}  # listed under Failed in otherwise accepted calls
    with SqsStandin(delay_ms=10, fail_calls=(str(ids[25]),), refuse_entries=tuple(str(r) for r in refused)) as standin:
        result = handoff.send_batch(standin.client(), standin.queue_url, ids)
        accepted = {json.loads(b)["run_id"] for b in standin.stats.accepted}

    assert set(result.failed) == set(doomed_chunk) | refused
    assert set(result.sent) == set(ids) - set(doomed_chunk) - refused
    assert accepted == {str(i) for i in result.sent}
    assert standin.stats.max_in_flight > 1


def test_an_unexpected_exception_fails_its_chunk_only() -> None:
    """Not a botocore error either: the chunk is failed (repair resends it), the others are kept."""
    ids = [uuid.uuid4() for _ in range(40)]
    bad = ids[10:20]

    class Flaky:
        def send_message_batch(self, QueueUrl: str, Entries: list[dict[str, str]]) -> dict[str, object]:
            if any(e["Id"] == bad[0].hex for e in Entries):
                raise RuntimeError("connection reset")
            return {"Successful": [{"Id": e["Id"]} for e in Entries], "Failed": []}

    result = handoff.send_batch(Flaky(), "https://unused", ids)
    assert set(result.failed) == set(bad) and set(result.sent) == set(ids) - set(bad)


def test_the_pool_is_rebuilt_after_it_is_closed(standin: SqsStandin) -> None:
    first = handoff.pool()
    handoff.close_pool()
    ids = [uuid.uuid4() for _ in range(30)]
    assert len(handoff.send_batch(standin.client(), standin.queue_url, ids).sent) == 30
    assert handoff.pool() is not first


def test_the_standin_answers_without_waiting_for_nagle() -> None:
    """With Nagle's algorithm on, the body's write waited for the client's delayed ACK of the headers'
    write (~40 ms a call), so a tick "at 0 ms" measured the stand-in; ``nagle=True`` keeps the old way."""
    with SqsStandin() as fast, SqsStandin(nagle=True) as old:
        assert fast.server.RequestHandlerClass.disable_nagle_algorithm is True
        assert old.server.RequestHandlerClass.disable_nagle_algorithm is False
        assert handoff.send_batch(fast.client(), fast.queue_url, [uuid.uuid4()]).failed == ()
