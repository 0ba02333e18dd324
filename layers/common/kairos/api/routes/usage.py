"""Usage: the caller's model tokens, cost, calls and runs per UTC day (``GET /v1/usage``).

The days come from the budget ledger (``kairos.budgets``): what settled model calls used, charged to
the owner's UTC day of the call — the same numbers the daily ceilings are held against.
"""

from __future__ import annotations

from datetime import date, timedelta
from typing import Annotated, Any

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Query

from kairos import budgets
from kairos.api import models
from kairos.api.resolver import Routes, principal
from kairos.api.routes import database, ok
from kairos.errors import MIN, FieldError, ValidationFailed
from kairos.instants import IsoDay

router = Routes()


@router.endpoint("GET", "/v1/usage", status=200, model=models.UsageDays, errors=(),
                 summary=f"Your tokens, cost and runs per UTC day in [from, until) (at most {budgets.MAX_USAGE_DAYS} "
                         f"days; until defaults to tomorrow, from to {budgets.DEFAULT_USAGE_DAYS} days before until)")
def get_usage(
    start: Annotated[IsoDay | None, Query(alias="from", description="first UTC day (YYYY-MM-DD), inclusive")] = None,
    until: Annotated[IsoDay | None, Query(description="UTC day (YYYY-MM-DD) after the last one, exclusive")] = None,
) -> Response[dict[str, Any]]:
    owner = principal()
    with database().transaction() as conn:
        if until is None:
            until = budgets.today(conn) + timedelta(days=1)  # today included
        if start is None:
            start = _default_start(until)
        _check(start, until)
        days = budgets.days(conn, owner=owner, start=start, until=until)
    return ok(200, models.UsageDays, {"days": [d.as_json() for d in days]})


def _default_start(until: date) -> date:
    """``DEFAULT_USAGE_DAYS`` before ``until``; a day too early to count back from (0001-01-01 overflowed
    the calendar: a 500) is ``until`` / ``min``."""
    earliest = date.min + timedelta(days=budgets.DEFAULT_USAGE_DAYS)
    if until < earliest:
        raise ValidationFailed([FieldError("until", MIN, f"until is {earliest.isoformat()} or later, or give from")])
    return until - timedelta(days=budgets.DEFAULT_USAGE_DAYS)


def _check(start: date, until: date) -> None:
    if until <= start:
        raise ValidationFailed([FieldError("until", "after_from", "until must be a later day than from")])
    if (until - start).days > budgets.MAX_USAGE_DAYS:
        raise ValidationFailed([FieldError("until", "max_days",
                                           f"from and until may be at most {budgets.MAX_USAGE_DAYS} days apart")])
