"""The ``corpus`` field of a schedule or a chat turn: its model, its server caps, its checked form.

Role: ``validate`` turns the caller's ``corpus`` object into the canonical spec a run stores
(``runs.corpus``, ``schedules.corpus``): exactly one source (``s3`` with an allow-listed bucket and a
prefix inside the owner's namespace, or inline ``items``), ``instructions``, ``partition_size``
(default 20, at most 100), ``max_items`` (at most 10,000), ``formats`` (``jsonl`` default, also
``graphml``).

Guarantees: every problem is a ``FieldError`` under ``corpus.…`` naming the field and the rule
(``bucket_not_allowed``, ``one_source``, ``max_items``, ``max_bytes``, …), all reported at once; the
result is plain JSON with every default filled in, so a run never re-derives a default.

Tenancy: an S3 source reads only its owner's objects. Its prefix must lie in the owner's namespace,
``<owner>/`` (``namespace``: the owner as one key segment, written as secrets write it,
``kairos.secrets.owner_segment``), and defaults to it; any other prefix is refused
(``corpus.source.s3.prefix``, rule ``prefix_not_owned``). ``out_of_scope`` checks a stored spec again
before a run lists the bucket, so a spec written before this rule, or edited in the database, cannot
read another owner's objects.

Must not: read S3 or the database (enumeration is the run's, ``kairos.execution.corpus.manifest``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from kairos.errors import FieldError, ValidationFailed, from_validation_error
from kairos.secrets import owner_segment

PARTITION_SIZE_DEFAULT = 20
PARTITION_SIZE_MAX = 100
MAX_ITEMS_CAP = 10_000
INLINE_ITEMS_MAX = 1_000
INLINE_ITEM_MAX_BYTES = 16_384
INLINE_ITEMS_MAX_BYTES = 48_000  # inside the API's 64 KiB body bound, with room for the rest
INSTRUCTIONS_MAX_BYTES = 8_192
PREFIX_MAX = 1_024
Format = Literal["jsonl", "graphml"]
DEFAULT_FORMATS: tuple[Format, ...] = ("jsonl",)


class S3Source(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    bucket: StrictStr = Field(min_length=3, max_length=63)
    prefix: StrictStr | None = Field(default=None, max_length=PREFIX_MAX)  # None: the owner's namespace


class Source(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    s3: S3Source | None = None
    items: list[Any] | None = Field(default=None, min_length=1, max_length=INLINE_ITEMS_MAX)


class CorpusSpec(BaseModel):
    """A corpus: the items a run maps one partition at a time and the instructions of each map call."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: Source
    instructions: StrictStr = Field(min_length=1)
    partition_size: StrictInt = Field(default=PARTITION_SIZE_DEFAULT, ge=1, le=PARTITION_SIZE_MAX)
    max_items: StrictInt = Field(default=MAX_ITEMS_CAP, ge=1, le=MAX_ITEMS_CAP)
    formats: list[Format] = Field(default_factory=lambda: list(DEFAULT_FORMATS), min_length=1, max_length=2)

    @field_validator("instructions")
    @classmethod
    def _bounded(cls, value: str) -> str:
        if not value.strip():
            raise PydanticCustomError("empty", "give the instructions of each map call")
        if len(value.encode("utf-8")) > INSTRUCTIONS_MAX_BYTES:
            raise PydanticCustomError("max_length", f"at most {INSTRUCTIONS_MAX_BYTES} bytes (UTF-8)")
        return value


def item_text(item: Any) -> str:
    """An inline item as the text the model reads: a string as is, anything else as canonical JSON."""
    if isinstance(item, str):
        return item
    return json.dumps(item, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def namespace(owner: str) -> str:
    """``<owner>/``: the S3 key prefix every corpus prefix of ``owner`` must start with."""
    return f"{owner_segment(owner)}/"


def out_of_scope(spec: dict[str, Any], *, owner: str, buckets: Sequence[str]) -> str | None:
    """The rule a stored spec breaks (``bucket_not_allowed``, ``prefix_not_owned``), or None when
    ``owner`` may read its source (inline items always)."""
    s3 = spec.get("source", {}).get("s3")
    if s3 is None:
        return None
    if s3.get("bucket") not in buckets:
        return "bucket_not_allowed"
    prefix = s3.get("prefix")
    if not isinstance(prefix, str) or not prefix.startswith(namespace(owner)):
        return "prefix_not_owned"
    return None


def validate(raw: object, *, buckets: Sequence[str], owner: str, field: str = "corpus") -> dict[str, Any]:
    """The canonical spec of ``raw`` for ``owner``, or ``ValidationFailed`` listing every problem (see
    the module doc)."""
    try:
        spec = CorpusSpec.model_validate(raw)
    except ValidationError as error:
        raise ValidationFailed(from_validation_error(error, prefix=field)) from None
    problems: list[FieldError] = []
    source = spec.source
    if (source.s3 is None) == (source.items is None):
        problems.append(FieldError(f"{field}.source", "one_source", "give exactly one of s3 or items"))
    if source.s3 is not None and source.s3.bucket not in buckets:
        problems.append(FieldError(f"{field}.source.s3.bucket", "bucket_not_allowed",
                                   "this bucket is not listed in KAIROS_CORPUS_BUCKETS"))
    mine = namespace(owner)
    prefix = mine if source.s3 is None or source.s3.prefix is None else source.s3.prefix
    if source.s3 is not None and not prefix.startswith(mine):
        problems.append(FieldError(f"{field}.source.s3.prefix", "prefix_not_owned",
                                   f"a corpus reads only your own objects: the prefix must start with {mine}"))
    if source.items is not None:
        problems.extend(_items_problems(source.items, field))
        if len(source.items) > spec.max_items:
            problems.append(FieldError(f"{field}.source.items", "max_items",
                                       f"more items than max_items ({spec.max_items})"))
    if len(set(spec.formats)) != len(spec.formats):
        problems.append(FieldError(f"{field}.formats", "unique", "name each format once"))
    if problems:
        raise ValidationFailed(problems)
    checked: dict[str, Any] = {"instructions": spec.instructions, "partition_size": spec.partition_size,
                               "max_items": spec.max_items,
                               "formats": sorted(spec.formats, key=["jsonl", "graphml"].index)}
    if source.s3 is not None:
        checked["source"] = {"s3": {"bucket": source.s3.bucket, "prefix": prefix}}
    else:
        checked["source"] = {"items": list(source.items or [])}
    return checked


def _items_problems(items: list[Any], field: str) -> list[FieldError]:
    total = 0
    for i, item in enumerate(items):
        if not isinstance(item, str | dict):
            return [FieldError(f"{field}.source.items.{i}", "type", "an item is a string or an object")]
        size = len(item_text(item).encode("utf-8"))
        if size > INLINE_ITEM_MAX_BYTES:
            return [FieldError(f"{field}.source.items.{i}", "max_bytes",
                               f"an inline item is at most {INLINE_ITEM_MAX_BYTES} bytes")]
        total += size
    if total > INLINE_ITEMS_MAX_BYTES:
        return [FieldError(f"{field}.source.items", "max_bytes",
                           f"inline items are at most {INLINE_ITEMS_MAX_BYTES} bytes in all; use an s3 source")]
    return []
