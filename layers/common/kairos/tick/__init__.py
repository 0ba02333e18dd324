"""The tick: settle, repair, fire — PostgreSQL decides, SQS only carries run ids.

Role: what TickFunction runs every minute (docs/architecture.md "How it works"). ``Tick.run``
(``kairos.tick.loop``; this package only re-exports) does, in order:

1. settle (``kairos.tick.settle``): ended runs are accounted to their schedules, each once; 3
   failures in a row pause a schedule with an inbox note; runs queued behind an ended run are
   released and handed off;
2. repair (``kairos.tick.repair``): runs of vanished workers are rescued (or abandoned / failed with a
   diagnosis), queued runs whose handoff never reached SQS or is stale are sent again, and one SQS
   took five times without a claim fails ``undeliverable``;
3. fire (``kairos.tick.fire``): due schedules in bounded batches become occurrences and runs,
   committed before their ids are sent to SQS and the handoff stamped;
4. repeats fire batches (two in flight at once by default, each worker on its own part of the owners
   first, so their batches never share an owner's locks) until nothing is due or the invocation's
   remaining time runs short;
5. deliver (``kairos.tick.deliver``): owed notify webhooks are sent, a bounded number while time is
   left, each retried with backoff for up to 24 h (it never runs before the fires are done);
6. prune (``kairos.tick.prune``): expired idempotency receipts are deleted, and ended runs past
   ``KAIROS_RETENTION_DAYS`` lose their thread's entries and webhook payload, in bounded batches while
   time is left, then the tick logs and emits the metrics (FiresDispatched, FiresSkipped, HandoffFailures, Rescues,
   FireLagSeconds, TickDurationMs, RunsSettled, SchedulesPaused, RunsPruned, EntriesPruned).

Guarantees: any number of ticks may run at once, repeat a minute, arrive a day late or die between
two statements; every due fire still ends in exactly one occurrence with a decision and at most one
run, and every committed run reaches SQS (see the step modules). Each step is a small service with
a ``run_once`` that tests call directly.

Must not: decide from the Lambda clock or the EventBridge event time. ``clock`` is read only to log
how far the Lambda clock is from the database's.
"""

from __future__ import annotations

from kairos.tick.deliver import Deliver
from kairos.tick.fire import Fire
from kairos.tick.loop import FIRE_WORKERS, MIN_REMAINING_MS, Tick, TickReport
from kairos.tick.prune import Prune
from kairos.tick.repair import Repair
from kairos.tick.settle import Settle

__all__ = ["FIRE_WORKERS", "MIN_REMAINING_MS", "Deliver", "Fire", "Prune", "Repair", "Settle", "Tick", "TickReport"]
