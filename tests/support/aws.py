"""AWS stand-ins: a Lambda context, a moto SQS queue, and SQS events as the Lambda integration sends them."""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class LambdaContext:
    """The LambdaContext attributes the handlers and Powertools read; the time left is fixed."""

    remaining_ms: int = 600_000
    function_name: str = "kairos-test"
    function_version: str = "$LATEST"
    memory_limit_in_mb: int = 512
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    log_stream_name: str = "2026/01/01/[$LATEST]test"

    @property
    def invoked_function_arn(self) -> str:
        return f"arn:aws:lambda:us-east-1:123456789012:function:{self.function_name}"

    @property
    def log_group_name(self) -> str:
        return f"/aws/lambda/{self.function_name}"

    def get_remaining_time_in_millis(self) -> int:
        return self.remaining_ms


@pytest.fixture
def lambda_context() -> LambdaContext:
    """A context with ten minutes left (``LambdaContext(remaining_ms=…)`` for another deadline)."""
    return LambdaContext()


@dataclass(frozen=True)
class SqsQueue:
    client: Any
    url: str

    def drain(self) -> list[str]:
        """Every message body currently in the queue (each received once, then deleted)."""
        bodies: list[str] = []
        while True:
            got = self.client.receive_message(QueueUrl=self.url, MaxNumberOfMessages=10, WaitTimeSeconds=0)
            messages = got.get("Messages", [])
            if not messages:
                return bodies
            for m in messages:
                bodies.append(m["Body"])
                self.client.delete_message(QueueUrl=self.url, ReceiptHandle=m["ReceiptHandle"])

    def run_ids(self) -> list[uuid.UUID]:
        """The run ids of every message currently in the queue (drained)."""
        return [uuid.UUID(json.loads(b)["run_id"]) for b in self.drain()]


@pytest.fixture
def sqs_queue(monkeypatch: pytest.MonkeyPatch) -> Iterator[SqsQueue]:
    """moto's SQS (and every other moto service) for the test, with a queue named ``runs``."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        client = boto3.client("sqs", region_name="us-east-1")
        yield SqsQueue(client, client.create_queue(QueueName="runs")["QueueUrl"])


def sqs_event(*bodies: str) -> dict[str, Any]:
    """Records shaped like events/run_sqs.json, one per body, each with its own message id."""
    template = json.loads((ROOT / "events" / "run_sqs.json").read_text())["Records"][0]
    records = []
    for body in bodies:
        record = copy.deepcopy(template)
        record["messageId"] = str(uuid.uuid4())
        record["body"] = body
        records.append(record)
    return {"Records": records}


def run_body(run_id: uuid.UUID) -> str:
    return json.dumps({"run_id": str(run_id)})


def scheduled_event(time: str) -> dict[str, Any]:
    """EventBridge's rate(1 minute) event for the tick, as the rule sends it."""
    return {"version": "0", "id": str(uuid.uuid4()), "detail-type": "Scheduled Event", "source": "aws.events",
            "account": "000000000000", "time": time, "region": "us-east-1",
            "resources": ["arn:aws:events:us-east-1:000000000000:rule/tick"], "detail": {}}
