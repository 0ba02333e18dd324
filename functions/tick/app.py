"""TickFunction: EventBridge invokes it every minute; it runs one tick (``kairos.tick``).

Thin by design: build the tick from the per-container resources and run it until nothing is due or
the invocation's remaining time runs short. The SQS client is built only when the tick has a run id
to send (``runtime.LazySqs``), so a tick with nothing due never loads botocore. EventBridge's event
time is logged, never used: the database clock decides. Under SnapStart the snapshot is taken with
the SQS client built and the calendar warm (``kairos.snapstart``), so a restored tick that sends
pays for neither.
"""

from __future__ import annotations

from typing import Any

from kairos import runtime, snapstart
from kairos.observability import logger, metrics, tracer
from kairos.tick import Tick


def _warm_calendar() -> None:
    from datetime import UTC, datetime

    from kairos import calendar

    calendar.next_fire(calendar.Rule(calendar.ScheduleKind.CRON, cron="0 7 * * 1-5", timezone="Europe/Berlin"),
                       datetime(2026, 1, 1, tzinfo=UTC))


snapstart.register("tick", warm=(_warm_calendar,))


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    logger.info("tick invoked", extra={"action": "tick_invoked", "event_time": (event or {}).get("time"),
                                       "event_id": (event or {}).get("id")})
    settings = runtime.settings()
    tick = Tick(runtime.database(), runtime.LazySqs(), settings.run_queue_url or "",
                retention_days=settings.retention_days, egress_allow=settings.egress_allow)
    return tick.run(context.get_remaining_time_in_millis).as_dict()
