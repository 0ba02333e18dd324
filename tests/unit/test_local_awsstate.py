"""What ``kairos dev``'s moto holds survives a restart, a crash included (``kairos.local.awsstate``).

Given moto's server keeping its state in a directory, when secrets are stored, replaced and deleted,
messages are sent (one delayed, one received but not deleted) and objects put and deleted, then the
files hold each change as soon as its request is answered (mode 0600), and a new server restoring them
(moto's memory emptied, as in a new process) has every secret under the same ARN with its current
value and times, none of the deleted one; both messages, the in-flight one visible again, the delayed
one still delayed; and the buckets with the objects that were not deleted.
"""

from __future__ import annotations

import json
import shutil
import stat
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from kairos.local import awsstate, devstate

CREDENTIALS = {"region_name": "us-east-1", "aws_access_key_id": "local", "aws_secret_access_key": "local"}


def _forget_everything(endpoint: str) -> None:
    """moto's memory emptied, as a new process starts with it."""
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"), timeout=10).close()


@pytest.fixture
def servers() -> Iterator[list[tuple[awsstate.MotoServer, str]]]:
    started: list[tuple[awsstate.MotoServer, str]] = []
    yield started
    for server, endpoint in started:
        _forget_everything(endpoint)  # moto's memory is the process's: leave none of it to other tests
        server.stop()


def _server(servers: list[tuple[awsstate.MotoServer, str]]) -> tuple[awsstate.MotoServer, str, Any, Any]:
    server = awsstate.MotoServer()
    endpoint = server.start()
    servers.append((server, endpoint))
    return (server, endpoint, boto3.client("secretsmanager", endpoint_url=endpoint, **CREDENTIALS),
            boto3.client("sqs", endpoint_url=endpoint, **CREDENTIALS))


def _s3(endpoint: str) -> Any:
    return boto3.client("s3", endpoint_url=endpoint, **CREDENTIALS)


def test_secrets_and_queued_messages_are_saved_on_each_change_and_restored(
        servers: list[tuple[awsstate.MotoServer, str]], tmp_path: Path) -> None:
    first, endpoint, sm, sqs = _server(servers)
    state = tmp_path / "one"
    assert first.keep(state, endpoint) == {"secrets": 0, "messages": 0, "objects": 0}
    saved = state / devstate.AWS_FILE

    made = sm.create_secret(Name="kairos/alice/openai", SecretString="sk-1")
    assert "kairos/alice/openai" in saved.read_text()  # on disk once the answer is in
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    sm.put_secret_value(SecretId=made["ARN"], SecretString="sk-2")
    binary = sm.create_secret(Name="kairos/alice/blob", SecretBinary=b"\x00\xffkey")
    gone = sm.create_secret(Name="kairos/alice/old", SecretString="x")
    sm.delete_secret(SecretId=gone["ARN"], ForceDeleteWithoutRecovery=True)
    described = sm.describe_secret(SecretId=made["ARN"])

    queue = sqs.create_queue(QueueName="kairos-runs")["QueueUrl"]
    sqs.send_message(QueueUrl=queue, MessageBody=json.dumps({"run_id": "in-flight"}))
    sqs.send_message(QueueUrl=queue, MessageBody=json.dumps({"run_id": "deferred"}), DelaySeconds=600)
    received = sqs.receive_message(QueueUrl=queue, VisibilityTimeout=600)["Messages"]
    assert [json.loads(m["Body"])["run_id"] for m in received] == ["in-flight"]

    s3 = _s3(endpoint)
    s3.create_bucket(Bucket="kairos-corpus")
    s3.create_bucket(Bucket="kairos-empty")
    s3.put_object(Bucket="kairos-corpus", Key="alice/notes.txt", Body=b"first", ContentType="text/plain",
                  Metadata={"source": "e2e"})
    s3.put_object(Bucket="kairos-corpus", Key="alice/gone.txt", Body=b"soon deleted")
    s3.delete_object(Bucket="kairos-corpus", Key="alice/gone.txt")
    assert len(list((state / awsstate.BLOBS).iterdir())) == 1  # the deleted object's body went with it

    again = tmp_path / "two"
    shutil.copytree(state, again)  # what a stack killed now (SIGKILL) leaves behind
    _forget_everything(endpoint)
    crashed = json.loads((again / devstate.AWS_FILE).read_text())
    kept = next(s for s in crashed["secrets"] if s["name"] == "kairos/alice/openai")
    assert (kept["created"], kept["changed"]) == (int(described["CreatedDate"].timestamp()),
                                                  int(described["LastChangedDate"].timestamp()))
    kept["created"], kept["changed"] = 1_700_000_000, 1_700_000_100  # a day long past: kept, not restamped
    (again / devstate.AWS_FILE).write_text(json.dumps(crashed))

    second, endpoint, sm, sqs = _server(servers)
    queue = sqs.create_queue(QueueName="kairos-runs")["QueueUrl"]  # as the stack makes it before restoring
    assert second.keep(again, endpoint) == {"secrets": 2, "messages": 2, "objects": 1}

    assert sm.get_secret_value(SecretId=made["ARN"])["SecretString"] == "sk-2"  # the old reference works
    back = sm.describe_secret(SecretId=made["ARN"])
    assert back["ARN"] == made["ARN"] and back.get("Tags", []) == []
    assert (back["CreatedDate"].timestamp(), back["LastChangedDate"].timestamp()) == (1_700_000_000, 1_700_000_100)
    assert sm.get_secret_value(SecretId=binary["ARN"])["SecretBinary"] == b"\x00\xffkey"
    assert [s["Name"] for s in sm.list_secrets()["SecretList"]] == ["kairos/alice/blob", "kairos/alice/openai"]

    counts = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["All"])["Attributes"]
    assert (counts["ApproximateNumberOfMessages"], counts["ApproximateNumberOfMessagesDelayed"]) == ("1", "1")
    visible = sqs.receive_message(QueueUrl=queue)["Messages"]
    assert [json.loads(m["Body"])["run_id"] for m in visible] == ["in-flight"]
    sqs.delete_message(QueueUrl=queue, ReceiptHandle=visible[0]["ReceiptHandle"])
    s3 = _s3(endpoint)
    assert {b["Name"] for b in s3.list_buckets()["Buckets"]} == {"kairos-corpus", "kairos-empty"}
    got = s3.get_object(Bucket="kairos-corpus", Key="alice/notes.txt")
    assert (got["Body"].read(), got["ContentType"], got["Metadata"]) == (b"first", "text/plain", {"source": "e2e"})
    assert [o["Key"] for o in s3.list_objects_v2(Bucket="kairos-corpus")["Contents"]] == ["alice/notes.txt"]
    left = json.loads((again / devstate.AWS_FILE).read_text())["queues"]
    assert [[json.loads(m["body"])["run_id"] for m in q["messages"]] for q in left] == [["deferred"]]


def test_an_unreadable_state_is_moved_aside_not_overwritten(
        servers: list[tuple[awsstate.MotoServer, str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / devstate.AWS_FILE).write_text("{not json")
    server, endpoint, sm, _ = _server(servers)
    assert server.keep(tmp_path, endpoint) == {"secrets": 0, "messages": 0, "objects": 0}
    assert (tmp_path / "aws.json.unreadable").read_text() == "{not json"
    assert "unreadable" in capsys.readouterr().err
    sm.create_secret(Name="kairos/bob/k", SecretString="v")
    assert json.loads((tmp_path / devstate.AWS_FILE).read_text())["secrets"][0]["name"] == "kairos/bob/k"
