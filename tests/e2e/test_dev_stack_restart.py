"""`kairos dev` keeps what it holds across a restart, a crash included, until `--reset`.

Given the local stack started as a newcomer starts it, when an owner stores a secret, writes a
conversation that references it, a message waits in the run queue (delayed, as a deferred run's
does) and an object is in S3, and the stack is then killed outright (SIGKILL), then the next start has
the same secret under the same reference (its value readable through it), the conversation, the
waiting message, the object and the same demo webhook URL; Ctrl-C then stops everything, the
database the crashed stack left running included. A start with `--reset` forgets all of it: no
secret, no conversation, an empty queue and bucket, a new webhook URL.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import boto3
import psutil
import pytest

from tests.support.output import http_json, start_dev, stop_dev, wait_for

pytestmark = pytest.mark.slow

AUTH = {"Authorization": "Bearer dev-token-alice"}


def _started(cwd: Path, *args: str) -> tuple[subprocess.Popen[str], str, str, list[str], Any]:
    """A started stack: (process, API base URL, demo webhook token, log, lines); each start has a new port."""
    proc, lines, log = start_dev(cwd, args=args)
    hook = wait_for(lines, r"webhook URL \(kept across restarts\): (\S+)", log).group(1)
    wait_for(lines, r"^running ", log)
    base, _, token = hook.partition("/v1/hooks/")
    return proc, base, token, log, lines


def _aws(cwd: Path) -> tuple[Any, Any, str, Any]:
    """Clients for the running stack's moto and its run queue's URL, from the env file it wrote:
    (secretsmanager, sqs, queue URL, s3)."""
    env = dict(line.split("=", 1) for line in (cwd / "state" / "env").read_text().splitlines()
               if "=" in line and not line.startswith("#"))
    where = {"endpoint_url": env["AWS_ENDPOINT_URL"], "region_name": "us-east-1",
             "aws_access_key_id": "local", "aws_secret_access_key": "local"}
    return (boto3.client("secretsmanager", **where), boto3.client("sqs", **where), env["RUN_QUEUE_URL"],
            boto3.client("s3", **where))


def _waiting(sqs: Any, queue_url: str) -> tuple[int, int]:
    counts = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["All"])["Attributes"]
    return int(counts["ApproximateNumberOfMessages"]), int(counts["ApproximateNumberOfMessagesDelayed"])


def _stop(proc: subprocess.Popen[str], log: list[str]) -> None:
    stop_dev(proc)  # killed after a minute: then the exit status below is not 0
    assert proc.returncode == 0, "".join(log)


def _using(path: Path) -> list[int]:
    return [p.pid for p in psutil.process_iter(["cmdline"]) if str(path) in " ".join(p.info["cmdline"] or [])]


def test_secrets_queued_messages_and_the_demo_hook_survive_a_crash_until_reset(tmp_path: Path) -> None:
    proc, base, hook, log, _ = _started(tmp_path)
    try:
        status, stored = http_json("PUT", f"{base}/v1/secrets/openai", {"value": "sk-e2e-kept"}, AUTH)
        assert status in (200, 201), stored
        reference = stored["secret"]["reference"]
        agent = {"executor": "openai", "model": "gpt-4o-mini", "base_url": "https://api.openai.com/v1",
                 "api_key_secret": reference}
        status, made = http_json("POST", f"{base}/v1/conversations", {"agent": agent, "title": "keeps"}, AUTH)
        assert status == 201, made
        conversation = made["conversation"]["id"]
        _, sqs, queue_url, s3 = _aws(tmp_path)
        waiting = json.dumps({"run_id": str(uuid.uuid4())})
        sqs.send_message(QueueUrl=queue_url, MessageBody=waiting, DelaySeconds=900)
        s3.put_object(Bucket="kairos-exports", Key="alice/kept.txt", Body=b"an object")
    finally:
        proc.kill()  # a crash: nothing runs on the way out
        proc.wait(timeout=60)

    proc, base, hook_again, log, _ = _started(tmp_path)
    try:
        assert hook_again == hook
        assert "aws state  1 secrets, 1 queued messages, 1 S3 objects restored" in "".join(log)
        status, listed = http_json("GET", f"{base}/v1/secrets", headers=AUTH)
        assert status == 200 and [(s["name"], s["reference"]) for s in listed["secrets"]] == [("openai", reference)]
        sm, sqs, queue_url, s3 = _aws(tmp_path)
        assert sm.get_secret_value(SecretId=reference)["SecretString"] == "sk-e2e-kept"  # as a run resolves it
        assert s3.get_object(Bucket="kairos-exports", Key="alice/kept.txt")["Body"].read() == b"an object"
        status, shown = http_json("GET", f"{base}/v1/conversations/{conversation}", headers=AUTH)
        assert status == 200 and shown["conversation"]["agent"]["api_key_secret"] == reference
        assert _waiting(sqs, queue_url) == (0, 1)
    finally:
        _stop(proc, log)
    assert _using(tmp_path) == [], "the database the crashed stack left running is stopped with this one"

    proc, base, hook_reset, log, _ = _started(tmp_path, "--reset")
    try:
        assert "reset      embedded database deleted" in "".join(log)
        assert hook_reset != hook
        status, listed = http_json("GET", f"{base}/v1/secrets", headers=AUTH)
        assert status == 200 and listed["secrets"] == []
        assert http_json("GET", f"{base}/v1/conversations/{conversation}", headers=AUTH)[0] == 404
        _, sqs, queue_url, s3 = _aws(tmp_path)
        assert _waiting(sqs, queue_url) == (0, 0)
        assert s3.list_objects_v2(Bucket="kairos-exports").get("Contents", []) == []
    finally:
        _stop(proc, log)
    assert _using(tmp_path) == []
