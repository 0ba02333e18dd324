"""Step-report fields the tick adds up: each step's report marks its own, the tick sums them blindly.

Role: a step report (``SettleReport``, ``RepairReport``, ``FireReport``, ``DeliverReport``,
``PruneReport``) declares each field that counts towards the tick's report with ``counted()``, naming
the ``TickReport`` field it adds to when the names differ (``DeliverReport.delivered`` adds to
``notify_delivered``). ``counts`` reads those marks; ``Tick`` sums them per name.

Guarantees: a new counted field on a step report needs an edit only in that report and ``TickReport``;
several fields may add to one total (settle's and fire's ``paused``); fields left unmarked (a batch's
``full`` flag, its cursor) never reach the tick's report.

Must not: compute anything but sums; derived figures (percentiles, batch counts) stay in the tick.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import Field, field, fields
from typing import Any

_TOTAL = "kairos.tick.total"  # the field metadata key: the TickReport field this one adds to


def counted(total: str | None = None, *, default: float = 0) -> Any:
    """A step report's field that adds to ``TickReport.<total>`` (by default, the field's own name)."""
    return field(default=default, metadata={_TOTAL: total})


def _total(f: Field[Any]) -> str | None:
    if _TOTAL not in f.metadata:
        return None
    return f.metadata[_TOTAL] or f.name


def totals_of(report_type: type) -> list[str]:
    """The TickReport fields a step report type adds to, in field order (a name once)."""
    names = (_total(f) for f in fields(report_type))
    return list(dict.fromkeys(name for name in names if name is not None))


def counts(report: Any) -> dict[str, float]:
    """What one step report adds to the tick's totals: TickReport field name -> amount."""
    out: dict[str, float] = {}
    for f in fields(report):
        name = _total(f)
        if name is not None:
            out[name] = out.get(name, 0) + getattr(report, f.name)
    return out


def add_up(groups: Iterable[tuple[type, Iterable[Any]]]) -> dict[str, Any]:
    """The totals of several steps' reports, each group given with its report type: every total a type
    declares is present (``0`` when the step made no report), like ``sum`` over an empty list."""
    out: dict[str, Any] = {}  # int or float, as the fields are: keyword arguments of TickReport
    for report_type, reports in groups:
        for name in totals_of(report_type):
            out.setdefault(name, 0)
        for report in reports:
            for name, amount in counts(report).items():
                out[name] = out.get(name, 0) + amount
    return out
