"""Corpus runs' test helpers: moto's S3 with the source and export buckets, and a scripted model
that answers each partition from its input and counts its calls per (partition, generation)."""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import psycopg
import pytest
from psycopg.rows import dict_row

from kairos.execution.corpus import export, manifest
from kairos.executors.base import PreparedCall, Reply
from kairos.settings import Settings
from tests.support.aws import SqsQueue
from tests.support.executors import ScriptedExecutor

SOURCE, EXPORTS = "corpus-source", "corpus-exports"
SETTINGS = Settings(corpus_buckets=(SOURCE,), export_bucket=EXPORTS)
IDENTITY = re.compile(r"partition (\d+), generation (\d+)")
ITEM = re.compile(r"^--- item (\d+): (\S+)$", re.MULTILINE)


def rows(url: str, query: str, *args: Any) -> list[dict[str, Any]]:
    with psycopg.connect(url, row_factory=dict_row, autocommit=True) as conn:
        return conn.execute(query, args).fetchall()


class Model:
    """A scripted model: answers each partition with one ``doc`` record per item and a shared
    ``topic`` record (merged by reduce); counts its calls per (partition, generation)."""

    def __init__(self, invalid: Callable[[int, int], bool] = lambda n, g: False,
                 invalid_answer: str = "Here are your records: not JSON") -> None:
        self.invalid = invalid
        self.invalid_answer = invalid_answer
        self.calls: Counter[tuple[int, int]] = Counter()
        self.lock = threading.Lock()
        self.executor = ScriptedExecutor(on_send=self.answer)

    def answer(self, prepared: PreparedCall, timeout: float) -> Reply:
        prompt = json.loads(prepared.body)["prompt"]
        found = IDENTITY.search(prompt)
        assert found is not None
        n, generation = int(found.group(1)), int(found.group(2))
        with self.lock:
            self.calls[(n, generation)] += 1
        if self.invalid(n, generation):
            return Reply(content=self.invalid_answer, usage={"prompt_tokens": 10, "completion_tokens": 5})
        lines = []
        for ordinal, key in ITEM.findall(prompt):
            lines.append(json.dumps({"kind": "doc", "id": key, "ordinal": int(ordinal), "partition": n}))
            lines.append(json.dumps({"kind": "topic", "id": f"t{int(ordinal) % 7}", "last": key,
                                     f"seen_{n}": True}))
        return Reply(content="\n".join(lines), usage={"prompt_tokens": 100, "completion_tokens": 50})


@pytest.fixture
def s3(sqs_queue: SqsQueue, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """moto's S3 (inside the sqs_queue fixture's mock) with the source and export buckets; parts of
    the export made small so an export has several."""
    import moto.s3.models

    monkeypatch.setattr(moto.s3.models, "S3_UPLOAD_PART_MIN_SIZE", 1024)
    monkeypatch.setattr(export, "PART_BYTES", 16 * 1024)
    manifest.s3_client.cache_clear()
    client = boto3.client("s3", region_name="us-east-1")
    client.create_bucket(Bucket=SOURCE)
    client.create_bucket(Bucket=EXPORTS)
    yield client
    manifest.s3_client.cache_clear()


@pytest.fixture
def corpus_env(monkeypatch: pytest.MonkeyPatch, s3: Any) -> Any:
    """``s3`` with the corpus source and export buckets configured, as the API handler reads them."""
    monkeypatch.setenv("KAIROS_CORPUS_BUCKETS", SOURCE)
    monkeypatch.setenv("KAIROS_EXPORT_BUCKET", EXPORTS)
    from kairos import runtime

    runtime.reset()
    return s3
