"""Enumerate: a corpus's source read into a manifest of items in stable order, and items read back.

Role: ``pages`` yields the source's items page by page — inline ``items`` in their given order, an
``s3`` prefix in S3's key order (``ListObjectsV2``) — each with its key, digest (the inline item's
SHA-256, the object's ETag) and size, at most ``max_items`` in all. ``read`` gives the text of one
item for a map call: the inline item again, or the S3 object, refused (``SourceChanged``) when its ETag
is no longer the manifest's, so a partition's input never changes under its identity.

Guarantees: deterministic (the same source gives the same manifest, ordinal by ordinal, so a restarted
enumerate rewrites nothing); bounded (one listing page at a time; an item's text at most
``ITEM_MAX_BYTES``). Buckets are those the spec was checked against (``KAIROS_CORPUS_BUCKETS``), and
a key is read only under the spec's prefix, which enumerate checked against the owner's namespace
(``kairos.schedules.corpus_spec.out_of_scope``).

Must not: write the database (``kairos.execution.corpus.phases`` does, under the fence); log keys' contents.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from kairos.schedules.corpus_spec import item_text

PAGE = 1_000
ITEM_MAX_BYTES = 65_536


@dataclass(frozen=True)
class Item:
    ordinal: int
    key: str
    digest: str
    bytes: int

    def as_json(self) -> dict[str, Any]:
        return {"ordinal": self.ordinal, "key": self.key, "digest": self.digest, "bytes": self.bytes}


class SourceChanged(Exception):
    """An item is no longer what the manifest recorded (changed or deleted since enumerate)."""


@lru_cache(maxsize=1)
def s3_client() -> Any:
    """One S3 client per process (``AWS_ENDPOINT_URL`` points it at moto locally)."""
    import boto3

    return boto3.client("s3")


def pages(spec: dict[str, Any]) -> Iterator[list[Item]]:
    """The manifest, one page at a time (see the module doc)."""
    limit = int(spec["max_items"])
    source = spec["source"]
    if "items" in source:
        items = [_inline(i, item) for i, item in enumerate(source["items"][:limit])]
        for start in range(0, len(items), PAGE):
            yield items[start : start + PAGE]
        return
    bucket, prefix = source["s3"]["bucket"], source["s3"]["prefix"]
    ordinal = 0
    paginator = s3_client().get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=bucket, Prefix=prefix, PaginationConfig={"PageSize": PAGE}):
        batch = []
        for obj in page.get("Contents", []):
            if ordinal >= limit:
                break
            if str(obj["Key"]).endswith("/"):
                continue  # a "folder" marker holds nothing
            batch.append(Item(ordinal, str(obj["Key"]), str(obj["ETag"]).strip('"'), int(obj["Size"])))
            ordinal += 1
        if batch:
            yield batch
        if ordinal >= limit:
            return


def _inline(ordinal: int, item: Any) -> Item:
    data = item_text(item).encode("utf-8")
    return Item(ordinal, f"items/{ordinal}", hashlib.sha256(data).hexdigest(), len(data))


def read(spec: dict[str, Any], item: Item) -> str:
    """The text of one manifest item (see the module doc)."""
    source = spec["source"]
    if "items" in source:
        text = item_text(source["items"][item.ordinal])
        if hashlib.sha256(text.encode("utf-8")).hexdigest() != item.digest:
            raise SourceChanged(item.key)
        return text
    from botocore.exceptions import ClientError

    if not item.key.startswith(str(source["s3"]["prefix"])):  # only what the checked prefix listed
        raise SourceChanged(item.key)
    try:
        got = s3_client().get_object(Bucket=source["s3"]["bucket"], Key=item.key,
                                     Range=f"bytes=0-{ITEM_MAX_BYTES - 1}")
    except ClientError as error:
        raise SourceChanged(item.key) from error
    if str(got["ETag"]).strip('"') != item.digest:
        raise SourceChanged(item.key)
    body: bytes = got["Body"].read()
    return body.decode("utf-8", errors="replace")
