"""The ``flow`` field of a webhook schedule: its model, bounds and checked form.

Role: ``validate`` turns the caller's ``flow`` object into the canonical settings a webhook schedule
stores (``schedules.flow``), read at intake by ``kairos.flow``:

* ``debounce_seconds`` (1..3,600): deliveries within the window fold into one run carrying the last
  payload and the count, dispatched once the window has been quiet that long (at most
  ``DEBOUNCE_MAX_FACTOR`` times the window after its first delivery);
* ``batch`` ``{"max_events" (2..100), "max_wait_seconds" (1..300)}``: deliveries collect into one run
  whose payload is the array of them, dispatched at the count or the wait, whichever comes first;
* ``concurrency`` ``{"key": "<JSON pointer into the payload, RFC 6901>", "limit" (1..100, default 1)}``:
  at most ``limit`` runs of the schedule running per key value (enforced where runs are released);
* ``over_rate``: ``reject`` (default: 429 with ``Retry-After``) or ``defer`` (accepted, dispatched
  when the hook's rate allows, within the owner's queue cap).

Debounce and batch exclude each other (``flow.batch``, rule ``exclusive``). Every problem is a
``FieldError`` under ``flow.…`` naming the field and the rule, all reported at once; the result is
plain JSON with ``over_rate`` (and a concurrency ``limit``) filled in.

Must not: read the database or a payload (``pointer_value`` is the one reader of a key, pure).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from kairos.errors import FieldError, ValidationFailed, from_validation_error
from kairos.states import OverRate

DEBOUNCE_MIN_SECONDS = 1
DEBOUNCE_MAX_SECONDS = 3_600
DEBOUNCE_MAX_FACTOR = 10  # a debounce window closes at the latest this many windows after its first delivery
BATCH_MIN_EVENTS = 2
BATCH_MAX_EVENTS = 100
BATCH_MAX_WAIT_SECONDS = 300
CONCURRENCY_MAX_LIMIT = 100
POINTER_MAX = 256
# RFC 6901: "" (the whole document) or "/"-separated tokens in which "~" appears only as ~0 or ~1.
_POINTER = re.compile(r"(/([^~/]|~[01])*)*")


class Batch(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_events: StrictInt = Field(ge=BATCH_MIN_EVENTS, le=BATCH_MAX_EVENTS)
    max_wait_seconds: StrictInt = Field(ge=1, le=BATCH_MAX_WAIT_SECONDS)


class Concurrency(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    key: StrictStr = Field(max_length=POINTER_MAX, description="a JSON pointer (RFC 6901) into the payload")
    limit: StrictInt = Field(default=1, ge=1, le=CONCURRENCY_MAX_LIMIT)

    @field_validator("key")
    @classmethod
    def _pointer(cls, value: str) -> str:
        if not _POINTER.fullmatch(value):
            raise PydanticCustomError("json_pointer", "give a JSON pointer (RFC 6901) such as /pull_request/number")
        return value


class Flow(BaseModel):
    """A webhook schedule's flow settings (see the module doc)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    debounce_seconds: StrictInt | None = Field(default=None, ge=DEBOUNCE_MIN_SECONDS, le=DEBOUNCE_MAX_SECONDS)
    batch: Batch | None = None
    concurrency: Concurrency | None = None
    over_rate: OverRate = OverRate.REJECT


def validate(raw: object) -> dict[str, Any]:
    """The checked flow JSON (``over_rate`` filled in); ``ValidationFailed`` naming ``flow.<path>``."""
    if not isinstance(raw, Mapping):
        raise ValidationFailed([FieldError("flow", "type", "give flow as a JSON object")])
    try:
        flow = Flow.model_validate(dict(raw))
    except ValidationError as error:
        problems = from_validation_error(error, prefix="flow")
        if raw.get("debounce_seconds") is not None and raw.get("batch") is not None:
            problems.append(_exclusive())
        raise ValidationFailed(problems) from None
    if flow.debounce_seconds is not None and flow.batch is not None:
        raise ValidationFailed([_exclusive()])
    return flow.model_dump(mode="json", exclude_none=True)


def _exclusive() -> FieldError:
    return FieldError("flow.batch", "exclusive", "debounce_seconds and batch cannot be combined: a window "
                      "either folds deliveries or collects them")


_MISSING = object()


def pointer_value(document: Any, pointer: str) -> Any:
    """The value ``pointer`` (RFC 6901) names in ``document``, or ``None`` when it names nothing."""
    if pointer == "":
        return document
    node = document
    for escaped in pointer[1:].split("/"):
        part = escaped.replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping):
            node = node.get(part, _MISSING)
        elif isinstance(node, list) and part.isascii() and part.isdigit() and (part == "0" or part[0] != "0"):
            index = int(part)
            node = node[index] if index < len(node) else _MISSING
        else:
            return None
        if node is _MISSING:
            return None
    return node
