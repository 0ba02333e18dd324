"""Strict JSON Lines: what a map call's answer must be, checked before anything of it is committed.

Role: ``parse`` reads one completed answer into records — every non-blank line one JSON object with a
non-empty string ``id`` and a non-empty string ``kind`` — or names the first problem (``Invalid``),
which makes the partition's next repair generation (``kairos.execution.corpus.mapping``). A line the database
could not store (a NUL or lone surrogate in a key or a string, ``NaN`` or ``1e999``, nesting past
``kairos.executors.base.ARGUMENTS_DEPTH_MAX``) is ``unstorable``, a line nested past the parser
``not_json``: invalid answers like any other, never a failed write.

Guarantees: bounded — at most ``MAX_LINES`` records, ids and kinds at most ``MAX_KEY`` characters, each
record at most ``MAX_RECORD_BYTES``; a code fence around the whole answer (```` ``` ````) is tolerated,
nothing else is (no prose, no arrays, no trailing commas). The problem text never quotes the answer.

Must not: touch the database or the model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kairos.executors.base import json_problem

MAX_LINES = 2_000
MAX_KEY = 256
MAX_RECORD_BYTES = 65_536


@dataclass(frozen=True)
class Line:
    line: int
    kind: str
    id: str
    data: dict[str, Any]  # the object without its id and kind

    def as_json(self) -> dict[str, Any]:
        return {"line": self.line, "kind": self.kind, "id": self.id, "data": self.data}


@dataclass(frozen=True)
class Invalid:
    code: str  # a stable word: not_json, not_object, missing_id, missing_kind, too_many_lines, too_large,
    # unstorable
    line: int

    def describe(self) -> str:
        words = {
            "not_json": "is not JSON", "not_object": "is not a JSON object",
            "missing_id": 'has no non-empty string "id"', "missing_kind": 'has no non-empty string "kind"',
            "too_many_lines": f"is past the {MAX_LINES}-line limit", "too_large": "is too large",
            "unstorable": "holds a NUL character, a number that is not finite or nesting too deep",
        }
        return f"line {self.line} {words.get(self.code, 'is invalid')}"


def parse(answer: str) -> list[Line] | Invalid:
    lines = _unfenced(answer).splitlines()
    out: list[Line] = []
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        if len(out) >= MAX_LINES:
            return Invalid("too_many_lines", number)
        if len(text.encode("utf-8")) > MAX_RECORD_BYTES:
            return Invalid("too_large", number)
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            return Invalid("not_json", number)
        if not isinstance(value, dict):
            return Invalid("not_object", number)
        if json_problem(value) is not None:
            return Invalid("unstorable", number)
        ident, kind = value.get("id"), value.get("kind")
        if not isinstance(ident, str) or not ident.strip() or len(ident) > MAX_KEY:
            return Invalid("missing_id", number)
        if not isinstance(kind, str) or not kind.strip() or len(kind) > MAX_KEY:
            return Invalid("missing_kind", number)
        data = {k: v for k, v in value.items() if k not in ("id", "kind")}
        out.append(Line(number, kind, ident, data))
    return out


def _unfenced(answer: str) -> str:
    text = answer.strip()
    if text.startswith("```") and text.endswith("```") and len(text) >= 6:
        first_newline = text.find("\n")
        if first_newline == -1:
            return ""
        return text[first_newline + 1 : -3]
    return text
