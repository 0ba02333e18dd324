"""Export: the canonical records streamed to S3 in stable order, resumable after a restart.

Role: ``export_all`` writes each format of the spec (``jsonl``, ``graphml``) to
``KAIROS_EXPORT_BUCKET`` at ``exports/<owner>/<run_id>/records.<ext>``: records are read in
(``kind``, ``id``) order in bounded pages (``PAGE``), rendered, and sent as the parts of one multipart
upload of at least ``PART_BYTES`` each (the last may be smaller). After each part the checkpoint
(``corpus_exports``: upload id, parts done, the last key written, bytes so far) is committed under
the run's fence; a restart continues the same upload after that key. When the upload completes, its
SHA-256 is computed by reading the object back in chunks, and the export is marked done.

Guarantees: byte-identical output whatever the restarts (rendering is deterministic, a part is a
function of the key it starts after, and a part sent again replaces itself); bounded memory (one page
of records and one part at a time). A JSON Lines line is ``{"data", "id", "kind", "lineage"}`` as
canonical JSON (sorted keys, compact, ASCII); GraphML has one node per record (``kind:id``) with its
kind and data, and one edge per ``links`` entry of its data naming another ``{"kind", "id"}``.

Must not: hold a transaction across an S3 call; write anywhere but the export bucket.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from psycopg.types.json import Jsonb

from kairos import db
from kairos.execution.corpus import manifest
from kairos.execution.corpus.context import Corpus
from kairos.execution.stops import Failure, LeaseLost

PAGE = 500
PART_BYTES = 8 * 1024 * 1024
READ_CHUNK = 1024 * 1024
EXTENSIONS = {"jsonl": "jsonl", "graphml": "graphml"}
CONTENT_TYPES = {"jsonl": "application/jsonl", "graphml": "application/graphml+xml"}

GRAPHML_HEAD = (
    '<?xml version="1.0" encoding="UTF-8"?>\n'
    '<graphml xmlns="http://graphml.graphdrawing.org/xmlns">\n'
    '<key id="kind" for="node" attr.name="kind" attr.type="string"/>\n'
    '<key id="data" for="node" attr.name="data" attr.type="string"/>\n'
    '<graph id="records" edgedefault="directed">\n'
)
GRAPHML_TAIL = "</graph>\n</graphml>\n"


def key_of(owner: str, run_id: Any, fmt: str) -> str:
    return f"exports/{owner}/{run_id}/records.{EXTENSIONS[fmt]}"


def export_all(c: Corpus) -> None:
    """Writes every format of the spec (see the module doc)."""
    bucket = c.run.settings.export_bucket
    if not bucket:
        raise Failure("corpus_export_unavailable", summary="No export bucket is configured (KAIROS_EXPORT_BUCKET).")
    for fmt in c.spec["formats"]:
        with c.fenced() as (conn, _):
            db.execute(conn, "corpus_exports_open", {"run_id": c.run_id, "format": fmt, "bucket": bucket,
                                                     "key": key_of(c.owner, c.run_id, fmt), "now": c.run.now})
            row = db.fetch_row(conn, "corpus_exports_get", {"run_id": c.run_id, "format": fmt})
        if not row["done"]:
            try:
                _stream(c, fmt, row)
            except (LeaseLost, Failure):
                raise
            except Exception as error:
                raise Failure("corpus_export_unavailable", retry_safe=True) from error


def render(fmt: str, record: db.Row) -> bytes:
    """One record as its bytes in the export (deterministic)."""
    if fmt == "jsonl":
        line = {"kind": record["kind"], "id": record["id"], "data": record["data"], "lineage": record["lineage"]}
        return json.dumps(line, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii") + b"\n"
    node_id = f"{record['kind']}:{record['id']}"
    data = json.dumps(record["data"], sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    out = [f"<node id={quoteattr(node_id)}><data key=\"kind\">{escape(record['kind'])}</data>"
           f"<data key=\"data\">{escape(data)}</data></node>\n"]
    links = record["data"].get("links") if isinstance(record["data"], dict) else None
    for link in links if isinstance(links, list) else []:
        if isinstance(link, dict) and isinstance(link.get("kind"), str) and isinstance(link.get("id"), str):
            out.append(f"<edge source={quoteattr(node_id)} target={quoteattr(link['kind'] + ':' + link['id'])}/>\n")
    return "".join(out).encode("utf-8")


def _records(c: Corpus, after: tuple[str, str] | None) -> Iterator[db.Row]:
    while True:
        with c.run.database.connection() as conn:
            rows = db.fetch_all(conn, "corpus_records_page", {
                "run_id": c.run_id, "after_kind": None if after is None else after[0],
                "after_id": None if after is None else after[1], "limit": PAGE})
        yield from rows
        if len(rows) < PAGE:
            return
        after = (rows[-1]["kind"], rows[-1]["id"])


def _stream(c: Corpus, fmt: str, row: db.Row) -> None:
    s3 = manifest.s3_client()
    bucket, key = row["bucket"], row["key"]
    upload_id: str | None = row["upload_id"]
    parts: list[dict[str, Any]] = list(row["parts"] or [])
    total = int(row["bytes"])
    after = None if row["last_kind"] is None else (str(row["last_kind"]), str(row["last_id"]))
    if upload_id is not None and _already_complete(s3, bucket, key, upload_id):
        _finish(c, fmt, bucket, key)
        return
    if upload_id is None:
        upload_id = s3.create_multipart_upload(Bucket=bucket, Key=key, ContentType=CONTENT_TYPES[fmt])["UploadId"]
        _checkpoint(c, fmt, upload_id, parts, after, total)
    buffer = bytearray(GRAPHML_HEAD.encode() if fmt == "graphml" and after is None and not parts else b"")
    last = after
    for record in _records(c, after):
        buffer += render(fmt, record)
        last = (record["kind"], record["id"])
        if len(buffer) >= PART_BYTES:
            total = _part(c, s3, fmt, bucket, key, upload_id, parts, bytes(buffer), last, total)
            buffer = bytearray()
    if fmt == "graphml":
        buffer += GRAPHML_TAIL.encode()
    if buffer or not parts:
        total = _part(c, s3, fmt, bucket, key, upload_id, parts, bytes(buffer), last, total)
    s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id,
                                 MultipartUpload={"Parts": [{"PartNumber": p["n"], "ETag": p["etag"]} for p in parts]})
    _finish(c, fmt, bucket, key)


def _part(c: Corpus, s3: Any, fmt: str, bucket: str, key: str, upload_id: str, parts: list[dict[str, Any]],
          body: bytes, last: tuple[str, str] | None, total: int) -> int:
    number = len(parts) + 1
    sent = s3.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=body)
    parts.append({"n": number, "etag": sent["ETag"], "bytes": len(body)})
    total += len(body)
    _checkpoint(c, fmt, upload_id, parts, last, total)
    c.run.probes.fire("corpus_part", run_id=c.run_id, fence=c.fence, format=fmt, part=number)
    return total


def _checkpoint(c: Corpus, fmt: str, upload_id: str, parts: list[dict[str, Any]], last: tuple[str, str] | None,
                total: int) -> None:
    with c.fenced() as (conn, _):
        if db.fetch_one(conn, "corpus_exports_checkpoint", {
                "run_id": c.run_id, "format": fmt, "upload_id": upload_id, "parts": Jsonb(parts),
                "last_kind": None if last is None else last[0], "last_id": None if last is None else last[1],
                "bytes": total, "now": c.run.now}) is None:
            raise LeaseLost()


def _already_complete(s3: Any, bucket: str, key: str, upload_id: str) -> bool:
    """True when the checkpointed upload was completed before a crash (it is no longer open)."""
    from botocore.exceptions import ClientError

    try:
        s3.list_parts(Bucket=bucket, Key=key, UploadId=upload_id, MaxParts=1)
        return False
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") != "NoSuchUpload":
            raise
    s3.head_object(Bucket=bucket, Key=key)  # raises when it is gone: the export fails, retry-safe
    return True


def _finish(c: Corpus, fmt: str, bucket: str, key: str) -> None:
    s3 = manifest.s3_client()
    digest = hashlib.sha256()
    size = 0
    body = s3.get_object(Bucket=bucket, Key=key)["Body"]
    for chunk in iter(lambda: body.read(READ_CHUNK), b""):
        digest.update(chunk)
        size += len(chunk)
    with c.fenced() as (conn, _):
        if db.fetch_one(conn, "corpus_exports_finish", {"run_id": c.run_id, "format": fmt, "bytes": size,
                                                        "sha256": digest.hexdigest(), "now": c.run.now}) is None:
            raise LeaseLost()
