"""moto for ``kairos dev``, with what it holds kept in the data directory across restarts.

moto keeps Secrets Manager, SQS and S3 in memory: a restart of the local stack used to forget every
secret an owner had stored (conversations kept the dead reference and failed ``secret_unavailable``),
every message still waiting in the run queue and every object (corpus sources, exports).
``MotoServer`` is moto's threaded server with one addition: once ``keep`` has been called, after each
request it answers it reads the state of those services and, when it changed, writes it to
``<data-dir>/aws.json`` (objects' bodies to ``<data-dir>/aws-s3/``, one file per content digest)
before the answer goes out. A secret that ``PUT /v1/secrets`` stored, a message SQS accepted or an
object S3 took is on disk by the time the caller hears so, and a stack killed outright (SIGKILL) loses
nothing it acknowledged. ``keep`` first puts the saved state back through moto's API, then starts
saving.

What is kept:

* each secret's name, ARN, current value (``SecretString`` or ``SecretBinary``), description, tags and
  its created and changed times. The ARN's random six-letter suffix is put back with moto's
  ``_custom_id_`` tag (removed again at once), so every reference written into a conversation,
  schedule or webhook stays valid;
* each queue's messages not yet deleted, in order: body, FIFO group and deduplication ids, and the
  delay they had left (a deferred or backed-off run keeps waiting). A message received but not
  deleted (in flight when the stack stopped) comes back visible, as SQS makes it visible once its
  visibility timeout passes; receive counts start again. The tick's repair remains the backstop it
  is on AWS: a queued run whose message is lost anyway is sent again once its handoff is stale.

* each bucket, and each object's current body, content type and user metadata.

Not kept: a secret's earlier versions, secrets scheduled for deletion, message attributes, objects'
earlier versions and times, bucket settings. ``kairos dev --reset`` deletes all of it
(``kairos.local.devstate.reset``).

Guarantees: each file is written 0600 through a temporary file and a rename (never half written; not
fsynced: a crash of the stack loses nothing, a power cut may lose the last changes); an
unreadable file is moved aside as ``aws.json.unreadable`` with one line, never silently overwritten;
values are never printed. Reads moto's models (``secretsmanager_backends``, ``sqs_backends``) for the
snapshot, and ``s3_backends``: ``tests/unit/test_local_awsstate.py`` fails if a moto upgrade changes them.
"""

from __future__ import annotations

import base64
import json
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from kairos.local import devstate

STATE_FILE = devstate.AWS_FILE  # "aws.json"
BLOBS = devstate.AWS_BLOBS  # "aws-s3": S3 objects' bodies, one file per content digest
_USER_META = "x-amz-meta-"
FORMAT = 1
CUSTOM_ID_TAG = "_custom_id_"  # moto: a resource created with this tag takes its value as its id
_CREDENTIALS: dict[str, Any] = {"aws_access_key_id": "local", "aws_secret_access_key": "local"}


class MotoServer:
    """moto's server on 127.0.0.1 (``port`` 0: a free one); ``keep(data_dir)`` restores and then saves
    Secrets Manager and SQS state there. ``stop()`` shuts it down."""

    def __init__(self, port: int = 0) -> None:
        self._port = port
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._path: Path | None = None
        self._written: str | None = None

    def start(self) -> str:
        """Serves moto in a thread; the endpoint URL."""
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
        from werkzeug.serving import make_server

        app = DomainDispatcherApplication(create_backend_app)
        self._server = make_server("127.0.0.1", self._port, self._saving(app), True,
                                   request_handler=MotoRequestHandler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="moto", daemon=True)
        self._thread.start()
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def keep(self, data_dir: Path, endpoint: str) -> dict[str, int]:
        """Puts back what ``data_dir`` holds, then saves every change there; what was restored."""
        path = data_dir / STATE_FILE
        restored = restore(endpoint, load(path), data_dir / BLOBS)
        with self._lock:
            self._path = path
            self._written = path.read_text(encoding="utf-8") if path.exists() else None
        self.save()  # what was restored, in this version's form
        return restored

    def save(self) -> None:
        """Writes the current state when it changed since the last write (no-op before ``keep``):
        new objects' bodies first, then the state that names them, then bodies no longer named go."""
        with self._lock:
            if self._path is None:
                return
            bodies: dict[str, Any] = {}
            for attempt in range(3):  # moto's dicts may change under a concurrent request: read again
                try:
                    bodies.clear()
                    text = json.dumps(snapshot(bodies), sort_keys=True, indent=1) + "\n"
                    break
                except RuntimeError:
                    if attempt == 2:
                        raise
            if text == self._written:
                return
            blobs = self._path.parent / BLOBS
            for name, key in bodies.items():
                if not (blobs / name).exists():
                    write_atomically(blobs / name, key.value)
            write_atomically(self._path, text)
            self._written = text
            for stale in (blobs.iterdir() if blobs.is_dir() else ()):
                if stale.name not in bodies and not stale.name.startswith("."):
                    stale.unlink(missing_ok=True)

    def _saving(self, app: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
        def wsgi(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            answer = app(environ, start_response)
            try:
                body = list(answer)  # moto builds its answers in memory; nothing is sent before this returns
            finally:
                close = getattr(answer, "close", None)
                if close is not None:
                    close()
            if _reads_only(environ):
                return body
            try:
                self.save()
            except Exception as exc:  # noqa: BLE001 - the stack stays up; the line says what was not kept
                print(f"aws state  could not be saved: {type(exc).__name__}: {exc}", file=sys.stderr)
            return body

        return wsgi


# Calls that change nothing the snapshot holds (the worker long-polls ReceiveMessage every second; a
# receive changes only what is not kept: receive counts and visibility). Anything else is snapshotted.
_READS = frozenset({
    "ReceiveMessage", "GetQueueAttributes", "GetQueueUrl", "ListQueues", "ListQueueTags",
    "ListDeadLetterSourceQueues", "GetSecretValue", "BatchGetSecretValue", "DescribeSecret", "ListSecrets",
    "ListSecretVersionIds", "GetResourcePolicy",
})


def _reads_only(environ: dict[str, Any]) -> bool:
    """A request that cannot change the saved state: S3's GET and HEAD, and the JSON protocol's reads."""
    if environ.get("REQUEST_METHOD") in ("GET", "HEAD"):
        return True
    return str(environ.get("HTTP_X_AMZ_TARGET", "")).rpartition(".")[2] in _READS


def snapshot(bodies: dict[str, Any] | None = None) -> dict[str, Any]:
    """The secrets, queued messages and S3 objects moto holds now (values included: the file is
    private). Objects are named by their ETag (a digest of their content); ``bodies`` receives each
    one's moto key by that name, to write its body."""
    from moto.s3.models import s3_backends
    from moto.secretsmanager.models import FakeSecret, secretsmanager_backends
    from moto.sqs.models import sqs_backends

    secrets: list[dict[str, Any]] = []
    for _account, regions in list(secretsmanager_backends.items()):
        for region, backend in list(regions.items()):
            for secret in list(dict.values(backend.secrets)):
                if type(secret) is not FakeSecret or secret.deleted_date is not None:
                    continue  # replicas, and secrets scheduled for deletion
                version = secret.versions.get(secret.default_version_id or "", {})
                value = {"string": version.get("secret_string")} if version.get("secret_string") is not None \
                    else {"binary": version.get("secret_binary")}
                tags = [t for t in (secret.tags or []) if t.get("Key") != CUSTOM_ID_TAG]
                secrets.append({"region": region, "name": secret.name, "arn": secret.arn, **value,
                                "description": secret.description, "tags": tags,
                                "created": secret.created_date, "changed": secret.last_changed_date})
    queues: list[dict[str, Any]] = []
    for _account, sqs_regions in list(sqs_backends.items()):
        for region, sqs_backend in list(sqs_regions.items()):
            for name, queue in list(sqs_backend.queues.items()):
                messages = [{"body": m.body, "delay_until_ms": m.delayed_until, "group_id": m.group_id,
                             "deduplication_id": m.deduplication_id} for m in list(queue._messages)]
                if messages:
                    queues.append({"region": region, "name": name, "messages": messages})
    buckets: list[dict[str, Any]] = []
    for _account, partitions in list(s3_backends.items()):
        for _partition, s3_backend in list(partitions.items()):
            for name, bucket in list(s3_backend.buckets.items()):
                objects = []
                for key_name, key in list(bucket.keys.items()):
                    blob = str(key.etag).strip('"')
                    meta = dict(key.metadata or {})
                    objects.append({"key": key_name, "body": blob, "content_type": meta.get("content-type"),
                                    "metadata": {k[len(_USER_META):]: v for k, v in meta.items()
                                                 if k.startswith(_USER_META)}})
                    if bodies is not None:
                        bodies[blob] = key
                buckets.append({"region": bucket.region_name, "name": name,
                                "objects": sorted(objects, key=lambda o: o["key"])})
    return {"format": FORMAT, "secrets": sorted(secrets, key=lambda s: (s["region"], s["name"])),
            "queues": sorted(queues, key=lambda q: (q["region"], q["name"])),
            "buckets": sorted(buckets, key=lambda b: b["name"])}


def load(path: Path) -> dict[str, Any]:
    """The saved state, or an empty one when there is none; an unreadable file is moved aside."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    try:
        saved = json.loads(text)
        if not isinstance(saved, dict) or saved.get("format") != FORMAT:
            raise ValueError("not a saved state of this format")
    except ValueError as exc:
        aside = path.with_name(path.name + ".unreadable")
        os.replace(path, aside)
        print(f"aws state  {path} is unreadable ({exc}): moved to {aside}; starting without it", file=sys.stderr)
        return {}
    return saved


def restore(endpoint: str, saved: dict[str, Any], blobs: Path) -> dict[str, int]:
    """Creates the saved secrets (same ARNs), sends the saved messages (with the delay they had left)
    and puts the saved objects (bodies from ``blobs``) through moto's API at ``endpoint``; counts."""
    import boto3

    counts = {"secrets": 0, "messages": 0, "objects": 0}
    for secret in saved.get("secrets", []):
        client = boto3.client("secretsmanager", endpoint_url=endpoint, region_name=secret["region"], **_CREDENTIALS)
        if _restore_secret(client, secret):
            counts["secrets"] += 1
    now_ms = time.time() * 1000
    for queue in saved.get("queues", []):
        sqs: Any = boto3.client("sqs", endpoint_url=endpoint, region_name=queue["region"], **_CREDENTIALS)
        try:
            url = sqs.get_queue_url(QueueName=queue["name"])["QueueUrl"]
        except sqs.exceptions.QueueDoesNotExist:
            url = sqs.create_queue(QueueName=queue["name"])["QueueUrl"]
        for message in queue["messages"]:
            left = math.ceil((float(message.get("delay_until_ms") or 0) - now_ms) / 1000)
            extra = {k: v for k, v in (("MessageGroupId", message.get("group_id")),
                                        ("MessageDeduplicationId", message.get("deduplication_id"))) if v}
            sqs.send_message(QueueUrl=url, MessageBody=message["body"],
                             **({"DelaySeconds": min(900, left)} if left > 0 else {}), **extra)
            counts["messages"] += 1
    for bucket in saved.get("buckets", []):
        s3: Any = boto3.client("s3", endpoint_url=endpoint, region_name=bucket["region"], **_CREDENTIALS)
        where = {} if bucket["region"] == "us-east-1" else {
            "CreateBucketConfiguration": {"LocationConstraint": bucket["region"]}}
        try:
            s3.create_bucket(Bucket=bucket["name"], **where)
        except (s3.exceptions.BucketAlreadyOwnedByYou, s3.exceptions.BucketAlreadyExists):
            pass
        for item in bucket["objects"]:
            try:
                body = (blobs / item["body"]).read_bytes()
            except OSError:
                print(f"aws state  the body of s3://{bucket['name']}/{item['key']} is missing: not restored",
                      file=sys.stderr)
                continue
            s3.put_object(Bucket=bucket["name"], Key=item["key"], Body=body, Metadata=item.get("metadata") or {},
                          **({"ContentType": item["content_type"]} if item.get("content_type") else {}))
            counts["objects"] += 1
    return counts


def _restore_secret(client: Any, secret: dict[str, Any]) -> bool:
    name, arn = secret["name"], secret["arn"]
    suffix = arn[len(arn) - 6:] if arn.rpartition(":secret:")[2].startswith(f"{name}-") else None
    tags = list(secret.get("tags") or [])
    value = ({"SecretString": secret["string"]} if secret.get("string") is not None
             else {"SecretBinary": base64.b64decode(secret.get("binary") or "")})
    try:
        made = client.create_secret(Name=name, **value, **({"Description": secret["description"]}
                                                           if secret.get("description") is not None else {}),
                                    Tags=tags + ([{"Key": CUSTOM_ID_TAG, "Value": suffix}] if suffix else []))
    except client.exceptions.ResourceExistsException:
        return False
    if suffix:
        client.untag_resource(SecretId=made["ARN"], TagKeys=[CUSTOM_ID_TAG])
    if made["ARN"] != arn:
        print(f"aws state  secret {name} came back as {made['ARN']} (was {arn}): references to it must be "
              "written again", file=sys.stderr)
    _keep_times(secret, made["ARN"], client.meta.region_name)
    return True


def _keep_times(secret: dict[str, Any], arn: str, region: str) -> None:
    """The secret's created and changed times as they were (moto's API sets them to now)."""
    from moto.secretsmanager.models import FakeSecret, secretsmanager_backends

    account = arn.split(":")[4]
    found = secretsmanager_backends[account][region].secrets.get(arn)
    if isinstance(found, FakeSecret):
        found.created_date = secret.get("created") or found.created_date
        found.last_changed_date = secret.get("changed") or found.last_changed_date


def write_atomically(path: Path, data: str | bytes) -> None:
    """``data`` to ``path`` (mode 0600) through a temporary file and a rename: whole or not at all."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # O_CREAT's mode applies to a new file only
    # No fsync: a killed process loses nothing written here (the kernel holds it); an fsync per queue
    # change would add ~10 ms to every SQS call of the local stack, to guard only against a power cut.
    with os.fdopen(fd, "wb") as out:
        out.write(data.encode("utf-8") if isinstance(data, str) else data)
    os.replace(temporary, path)
