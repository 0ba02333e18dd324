"""What the API shows of a corpus run: its progress, and its records page by page.

Role: ``progress`` answers ``GET /v1/runs/{id}/corpus`` — the phase, the coverage (partitions total /
succeeded / failed, items total / covered), partitions counted by state, and the export handles
(format, bucket, key, bytes, sha256) of the exports done. ``records`` answers
``GET /v1/runs/{id}/corpus/records?after=&limit=``: canonical records in (``kind``, ``id``) order,
keyset pages, ``next_after`` the cursor of the last record listed (null at the end); past retention
no records and ``pruned_at``.

Guarantees: owner-scoped — another owner's run, a missing run and a run that is not a corpus run
are the same ``NotFound`` (one error, one body); bounded pages (``MAX_LIMIT``); a cursor that cannot
be read is a 422 naming ``after``.

Must not: write anything; read S3 (the handles come from the database).
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any
from uuid import UUID

import psycopg

from kairos import db
from kairos.errors import FieldError, NotFound, ValidationFailed
from kairos.execution.corpus.phases import coverage, handles
from kairos.instants import rfc3339
from kairos.states import CorpusPartitionState

MAX_LIMIT = 200
DEFAULT_LIMIT = 50


def _owned_corpus(conn: psycopg.Connection[db.Row], run_id: UUID, owner: str) -> db.Row:
    row = db.fetch_one(conn, "runs_get_owned", {"run_id": run_id, "owner": owner})
    if row is None or row["corpus"] is None:
        raise NotFound("run")
    return row


def progress(conn: psycopg.Connection[db.Row], run_id: UUID, *, owner: str) -> dict[str, Any]:
    _owned_corpus(conn, run_id, owner)
    state = db.fetch_one(conn, "corpus_runs_get", {"run_id": run_id})
    counts = db.fetch_row(conn, "corpus_partitions_counts", {"run_id": run_id})
    items_total = 0 if state is None else int(state["items_total"])
    return {
        "phase": "enumerate" if state is None else state["phase"],
        "coverage": coverage({**{k: int(v) for k, v in counts.items()}, "items_total": items_total}),
        "partitions": {k: int(counts[k]) for k in (s.value for s in CorpusPartitionState)},
        "exports": handles(db.fetch_all(conn, "corpus_exports_list", {"run_id": run_id})),
    }


def records(conn: psycopg.Connection[db.Row], run_id: UUID, *, owner: str, after: str | None,
            limit: int | None) -> dict[str, Any]:
    run = _owned_corpus(conn, run_id, owner)
    cursor = _decode(after)
    if run["pruned_at"] is not None:  # retention deleted the records (kairos.tick.prune): say so, list none
        return {"records": [], "next_after": None, "pruned_at": rfc3339(run["pruned_at"])}
    size = DEFAULT_LIMIT if limit is None else max(1, min(int(limit), MAX_LIMIT))
    rows = db.fetch_all(conn, "corpus_records_page", {
        "run_id": run_id, "after_kind": None if cursor is None else cursor[0],
        "after_id": None if cursor is None else cursor[1], "limit": size})
    listed = [{"kind": r["kind"], "id": r["id"], "data": r["data"], "lineage": r["lineage"]} for r in rows]
    next_after = _encode(rows[-1]["kind"], rows[-1]["id"]) if len(rows) == size else None
    return {"records": listed, "next_after": next_after}


def _encode(kind: str, ident: str) -> str:
    return base64.urlsafe_b64encode(json.dumps([kind, ident], separators=(",", ":")).encode()).decode().rstrip("=")


def _decode(after: str | None) -> tuple[str, str] | None:
    if after is None or after == "":
        return None
    try:
        kind, ident = json.loads(base64.urlsafe_b64decode(after + "=" * (-len(after) % 4)))
        if isinstance(kind, str) and isinstance(ident, str):
            return kind, ident
    except (ValueError, TypeError, binascii.Error):
        pass
    raise ValidationFailed([FieldError("after", "cursor", "give the next_after of the previous page")])
