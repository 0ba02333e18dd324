"""SendMessageBatch CPU per call: the lean path (``kairos.sqs_batch``) beside botocore's client call.

What is measured: this process's CPU time (``time.process_time``: user + system, every thread) per
``SendMessageBatch`` of 10 run-id messages, one call after another, against the SQS stand-in
(``bench/sqs_standin.py``) answering at once in its own process (its CPU is not counted). The paths use
the same botocore client (same endpoint, credentials, connection pool): ``client.send_message_batch``,
``kairos.sqs_batch``'s sender for that client (its request written and its 200 read on a pooled
connection by ``kairos.http_wire``), the same sender through the client's HTTP session (urllib3 and
http.client: what the wire buys), and that sender through the session signing with botocore's
``SigV4Auth`` instead of its own SigV4 (what the own signer buys). ``--rounds`` rounds, each path
``--calls`` calls a round, interleaved (wire, session, session signed by botocore, botocore, wire, ...)
after a warm-up; medians and per-round ratios are reported, with the load average. The stand-in's
counts check that every message arrived.

Run: ``.venv/bin/python bench/sqs_send.py [--calls N] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from sqs_standin import StandinProcess

from kairos import handoff, sqs_batch


class BotocoreSigned(sqs_batch.Sender):
    """The lean path with botocore's own SigV4 signer (``SigV4Auth`` on an ``AWSRequest``) in place of
    ``sqs_batch``'s: what signing the request that way costs."""

    def _signed(self, body: bytes) -> Any:
        request = AWSRequest(method="POST", url=self._url, data=body, headers={
            "X-Amz-Target": sqs_batch.TARGET, "Content-Type": sqs_batch.CONTENT_TYPE, "x-amzn-query-mode": "true",
            "User-Agent": self._user_agent})
        SigV4Auth(self._credentials.get_frozen_credentials(), self._signing_name, self._region).add_auth(request)
        return request.prepare()


def entries() -> list[dict[str, Any]]:
    return [{"Id": run_id.hex, "MessageBody": handoff.body(run_id)} for run_id in (uuid.uuid4() for _ in range(10))]


def per_call_cpu(send: Callable[[list[dict[str, Any]]], dict[str, Any]], calls: int) -> float:
    """Microseconds of this process's CPU per call."""
    batches = [entries() for _ in range(calls)]
    started = time.process_time()
    for batch in batches:
        answer = send(batch)
        if len(answer.get("Successful", [])) != len(batch):
            raise SystemExit(f"a call was not accepted whole: {answer}")
    return (time.process_time() - started) / calls * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    load_start = os.getloadavg()
    with StandinProcess() as standin:
        client = standin.client(handoff.MAX_PARALLEL_CALLS)
        lean = sqs_batch.sender(client)
        if lean is None:
            raise SystemExit("the lean path does not recognise the stand-in's client")
        queue_url = standin.queue_url

        def botocore_call(batch: list[dict[str, Any]]) -> dict[str, Any]:
            return dict(client.send_message_batch(QueueUrl=queue_url, Entries=batch))

        def lean_call(batch: list[dict[str, Any]]) -> dict[str, Any]:
            return lean.send(queue_url, batch)

        signed_by_botocore = copy.copy(lean)
        signed_by_botocore.__class__ = BotocoreSigned
        signed_by_botocore._wire = None  # as it was measured before kairos.http_wire: the session's send
        through_session = copy.copy(lean)
        through_session._wire = None

        def session_call(batch: list[dict[str, Any]]) -> dict[str, Any]:
            return through_session.send(queue_url, batch)

        def botocore_signed_call(batch: list[dict[str, Any]]) -> dict[str, Any]:
            return signed_by_botocore.send(queue_url, batch)

        paths = {"lean (kairos.sqs_batch on kairos.http_wire)": lean_call,
                 "lean, through the client's HTTP session (urllib3 + http.client)": session_call,
                 "lean, through the session, signed by botocore's SigV4Auth": botocore_signed_call,
                 "botocore client": botocore_call}
        for send in paths.values():  # warm: connections, caches
            per_call_cpu(send, 50)
        figures: dict[str, list[float]] = {name: [] for name in paths}
        for _ in range(args.rounds):
            for name, send in paths.items():
                figures[name].append(per_call_cpu(send, args.calls))
        stats = standin.stats()
    expected = (args.rounds * args.calls + 50) * 10 * len(paths)
    print(f"\nSendMessageBatch of 10 messages, {args.calls:,} calls a path a round, {args.rounds} rounds "
          f"interleaved, against the stand-in in its own process; load average "
          f"{' '.join(f'{x:.2f}' for x in load_start)} at the start, "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end\n")
    print("| path | CPU µs per call (median) | rounds |\n|---|---:|---|")
    for name, values in figures.items():
        print(f"| {name} | {statistics.median(values):,.0f} | {' / '.join(f'{v:,.0f}' for v in values)} |")
    boto_values = figures["botocore client"]
    print()
    names = list(paths)
    wire_values, session_values = figures[names[0]], figures[names[1]]
    print("on the wire ÷ through the session per round: "
          + ", ".join(f"{a / b:.2f}" for a, b in zip(wire_values, session_values, strict=True))
          + f"; median {statistics.median(wire_values) / statistics.median(session_values):.2f}.")
    for name in list(paths)[:-1]:
        values = figures[name]
        print(f"{name} ÷ botocore client per round: "
              + ", ".join(f"{a / b:.2f}" for a, b in zip(values, boto_values, strict=True))
              + f"; median {statistics.median(values) / statistics.median(boto_values):.2f}.")
    print(f"The stand-in received {stats['entries']:,} messages in {stats['calls']:,} calls "
          f"(expected {expected:,}).")
    return 0 if stats["entries"] == expected else 1


if __name__ == "__main__":
    sys.exit(main())
