"""Time in the named queries follows ``kairos.db``'s rule: "now" is ``coalesce(%(now)s::timestamptz, now())``,
so the database clock is the authority and a test can move it. A bare ``now()`` (or another clock
function) in ``kairos/sql/*.sql`` is a query a test cannot move. Comments are not read.

Column defaults in the migrations (``created_at ... DEFAULT now()``) keep the database's own clock:
they are not named queries and are not scanned.
"""

from __future__ import annotations

import re
from pathlib import Path

SQL = Path(__file__).resolve().parents[2] / "layers/common/kairos/sql"

_MOVABLE = re.compile(r"coalesce\(\s*%\(now\)s(?:::timestamptz)?\s*,\s*now\(\)\s*\)", re.I)
_CLOCK = re.compile(
    r"\b(?:now|clock_timestamp|statement_timestamp|transaction_timestamp)\s*\(\s*\)"
    r"|\b(?:current_timestamp|current_date|current_time|localtimestamp|localtime)\b",
    re.I,
)
# A query that must read the real clock whatever a test says: (file, query name) -> why. None today.
_EXCEPTIONS: dict[tuple[str, str], str] = {}


def _queries() -> list[tuple[str, str, str]]:
    found = []
    for path in sorted(SQL.glob("*.sql")):
        for chunk in re.split(r"^-- name: ", path.read_text(encoding="utf-8"), flags=re.M)[1:]:
            name, _, body = chunk.partition("\n")
            code = "\n".join(line.split("--", 1)[0] for line in body.splitlines())
            found.append((path.name, name.strip(), code))
    return found


def test_the_scan_reads_the_named_queries() -> None:
    queries = _queries()
    assert len(queries) > 100
    assert any(_MOVABLE.search(code) for _, _, code in queries)


def test_every_clock_read_in_a_named_query_can_be_moved_by_a_test() -> None:
    bare = [
        f"{file}: {name}: {match}"
        for file, name, code in _queries()
        if (file, name) not in _EXCEPTIONS
        for match in _CLOCK.findall(_MOVABLE.sub("%(now)s", code))
    ]
    assert bare == []
