"""Per-owner budgets: running slots, the queued-run cap, daily token and cost ceilings, and usage.

Role: the server caps of docs/api.md "Budgets", all configured in
``kairos.settings`` (``KAIROS_OWNER_CONCURRENCY``, ``KAIROS_OWNER_QUEUE_MAX``,
``KAIROS_OWNER_DAILY_TOKENS``, ``KAIROS_OWNER_DAILY_COST_USD``, ``KAIROS_MODEL_PRICES``):

* **Slots.** A run is handed to SQS only once it holds one of its owner's running slots and, with a
  concurrency key (``runs.concurrency_key``, a webhook's ``flow.concurrency``), one of its key's: the
  others wait ``queued`` in PostgreSQL, unsent. ``release`` (``kairos_release_slots``, migration 0030)
  admits an owner's oldest waiting runs into its free slots under the owner's slot lock; the statement
  that ends or parks a run holding a slot does the same in that statement (a trigger), marking what it
  released with its own id (``released``: what its worker sends after commit). The tick's repair
  releases whatever a crash or a lost race left waiting beside a free slot. The claim takes the slot
  lock only for a run nobody released (a stray message; ``kairos_claim_slot_free``, migration 0038): a
  released run's claim takes no lock, and a claim that finds no slot leaves the run waiting, never
  re-sending it.
  The tick's fire admits at insert instead (``hold_owner_slots``, then ``occurrences_insert`` with
  ``admit``): under its owners' slot locks, a new run takes a free slot at once when nothing of its
  owner waits for one, by the release's own rules, so its fire sends it with no release after commit.
  An end takes the slot lock shared (migrations 0036, 0042): ends of one owner do not wait for each
  other; only one that finds runs waiting hands its slot out, one such end at a time (a second lock).
* **Queue.** ``hold_queues`` takes the owners' queue locks before a fire is recorded
  (``kairos.occurrences.record``); ``occurrences_insert`` records a fire that would queue more than
  the cap ``skipped_budget``, without a run.
* **Ceilings.** ``reserve`` charges a model call's estimate (input estimate + the agent's
  ``max_tokens``, and its price) to the owner's UTC day before the call, in the transaction that
  reserves the call's effect; ``False`` when the day has no room (the run fails ``budget_exhausted``
  before any call). The effect's settlement (a trigger on ``effects``, migrations 0011, 0022, 0041)
  replaces the reservation with the usage it records: ``priced`` puts ``input_tokens``,
  ``output_tokens`` and ``cost_usd`` into that usage. Prices (``price_per_million``) match the model's
  name case-folded, a dated snapshot at its model's price, and an unpriced model at the highest price.
* **Stripes.** An owner's day is 8 rows of ``usage_ledger_stripes`` (the view ``usage_ledger`` sums
  them), so one owner's runs do not queue on one row (a reservation and a settlement each hold their
  row to their commit). Each stripe holds an allowance, the allowances summing to the ceiling they were
  shared out for; ``kairos_usage_reserve`` (migration 0041) books a call on a stripe with room within
  its allowance without waiting (``SKIP LOCKED``, the run's own stripe — its id's last byte — first),
  else waits for the run's own stripe; when no stripe has room, the ceiling given is not the one shared
  out (a changed setting) or a stripe holds more than its allowance (a call used more than its
  estimate), it locks every stripe in stripe order, decides on the exact total and shares out what is
  left again. The effect records its stripe (``charge_stripe``); its settlement charges that stripe.
* **Usage**, call for call. Each settled effect carries its own call's usage: a model call its
  provider's counts priced, with ``calls: 1, steps: 1``; a tool call ``tool_calls: 1, steps: 1``; an
  ``http`` agent's request ``steps: 1``. A run's ``usage`` is the sum over its settled effects, written
  by every statement that moves it out of ``running`` (``kairos_run_usage``): the attempt before an
  approval or a question, a retry, a corpus slice or a rescue included. So ``calls`` counts the model
  calls that answered, on the run and in the day, and the day's tokens are its runs' tokens.
  ``days`` answers ``GET /v1/usage``: an owner's tokens, cost, model calls and runs (runs with a model
  call answered that day) per UTC day.

Guarantees: an owner never has more runs holding a slot (running, or released and on their way to a
claim) than its slots, nor a key more than its limit: every release and every claim of an unreleased
run counts under the owner's slot lock (exclusively), after whoever held it before committed; two
claims racing for an owner's last slot — exactly one wins. A run that ends never leaves a waiting run beside its
free slot (the release is in its ending statement, and a run recorded meanwhile is released by its
intake, which takes the same lock). Reservations are exact against the day's ceiling: a stripe grants
only within its allowance and the allowances never sum past the ceiling, a refusal is only decided on
the exact total under all the day's stripe locks, and a reservation that fits the exact total is
granted; so concurrent runs never reserve past it; actual usage can exceed an estimate only by what
the estimate missed (at most one reservation's worth per call in flight), and no stripe grants again
until the slow path has counted it. The ledger sums the usage of the effects that settled. A failed
or ambiguous model call gives its reservation back and charges nothing (its usage is unknown).

Lock order: a run's row, then its owner's slot lock, then the owner-day's stripes in stripe order.
A reservation runs under its run's row lock and holds one stripe (a try that books nothing is undone,
letting go of any stripe it locked) or, on the slow path, all of them taken in order; the settlement
holds its run's row (and at a run's end the slot lock) and then its one stripe, at commit; nothing
takes a run row or a slot lock while holding a stripe, so stripes cannot deadlock with either. A
transaction that closes several calls booked on different stripes would settle them at its commit in
the order they closed; the tick's rescue, which closes many runs' calls, first takes their stripes in
(owner, day, stripe) order as its last lock (``lock_charged``), the order the slow path takes them in.
Still out of order, and so able to meet a slow path in a deadlock that PostgreSQL ends by failing one
side: a claim closing several stale calls of its run booked on different stripes, and a transaction
that reserves twice (the worker and the corpus reserve once per transaction).

Must not: call anything outside the database; read prompts or replies (only counts).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

import psycopg

from kairos import db
from kairos.settings import Settings

MAX_USAGE_DAYS = 366
DEFAULT_USAGE_DAYS = 30
STRIPES = 8  # rows of an owner's day in usage_ledger_stripes (migration 0041's n)


# -- slots -------------------------------------------------------------------------------------------


def hold_owner_slots(conn: psycopg.Connection[db.Row], schedule_ids: Sequence[str]) -> None:
    """Takes the slot locks of these schedules' owners, in owner order, until the caller's transaction
    ends (the tick's fire, after the queue locks: ``kairos.occurrences.record`` with ``admit``)."""
    if schedule_ids:
        db.fetch_all(conn, "schedules_hold_owner_slots", {"schedule_ids": sorted(set(schedule_ids))})


def release(conn: psycopg.Connection[db.Row], owners: Sequence[str], *, now: datetime | None = None) -> list[UUID]:
    """Admits these owners' oldest waiting runs into their free slots (and keys); the runs released.
    Waits for the owners' slot locks (in owner order) and holds them to commit: call it last."""
    if not owners:
        return []
    rows = db.fetch_all(conn, "runs_release_slots", {"owners": sorted(set(owners)), "now": now})
    return [r["id"] for r in rows]


def owners_of(conn: psycopg.Connection[db.Row], run_ids: Sequence[UUID]) -> list[str]:
    """The owners of these runs, each once."""
    if not run_ids:
        return []
    return [str(r["owner"]) for r in db.fetch_all(conn, "runs_owners_of", {"ids": list(run_ids)})]


def resent(conn: psycopg.Connection[db.Row], run_ids: Sequence[UUID]) -> list[UUID]:
    """Of these runs, those queued that hold a slot and were sent before: a caller's deliberate re-send."""
    if not run_ids:
        return []
    return [r["id"] for r in db.fetch_all(conn, "runs_admitted_sent", {"ids": list(run_ids)})]


def held(conn: psycopg.Connection[db.Row], run_ids: Sequence[UUID], *, now: datetime | None = None) -> list[UUID]:
    """Of these runs, those queued and held by their webhook flow (``held_until`` ahead): their
    messages are timers, sent whether they hold a slot or not."""
    if not run_ids:
        return []
    return [r["id"] for r in db.fetch_all(conn, "runs_held_of", {"ids": list(run_ids), "now": now})]


def unsent(conn: psycopg.Connection[db.Row], run_ids: Sequence[UUID]) -> list[UUID]:
    """The runs these runs' ends (or parking) released (``released_by``) that still hold their slot,
    queued and never sent: what the releaser sends after its commit."""
    if not run_ids:
        return []
    return [r["id"] for r in db.fetch_all(conn, "runs_admitted_unsent", {"ids": list(run_ids)})]


# -- queue -------------------------------------------------------------------------------------------


def hold_queues(conn: psycopg.Connection[db.Row], schedule_ids: list[str], conversation_ids: list[str]) -> None:
    """Takes the queue locks of the owners of these schedules and of these conversations (a chat turn's,
    which has no schedule) until the caller's transaction ends."""
    if schedule_ids or conversation_ids:
        db.fetch_all(conn, "schedules_hold_owner_queues", {"schedule_ids": sorted(set(schedule_ids)),
                                                           "conversation_ids": sorted(set(conversation_ids))})


# -- ceilings ----------------------------------------------------------------------------------------


def price(settings: Settings, model: object, input_tokens: int, output_tokens: int) -> float:
    """The US dollars a call costs at ``KAIROS_MODEL_PRICES`` (``per_million``)."""
    per_million = price_per_million(settings.model_prices, model)
    return (input_tokens * per_million[0] + output_tokens * per_million[1]) / 1_000_000


def price_per_million(prices: Mapping[str, tuple[float, float]], model: object) -> tuple[float, float]:
    """The model's (input, output) US dollars per million tokens. Names match case-folded and trimmed,
    and a snapshot of a priced model costs what the model does: a trailing Bedrock version
    (``-v1:0``) and then a trailing date (``-2024-08-06``, ``-20240806``) are dropped until a name is
    priced. A model no name matches costs the ``"*"`` entry; without one, the highest input and the
    highest output price listed — never nothing, so no spelling of a model passes the cost ceiling
    for free. No prices at all: every call costs 0 (only the token ceiling applies)."""
    if not prices:
        return (0.0, 0.0)
    table: dict[str, tuple[float, float]] = {}
    for name, pair in prices.items():  # two spellings of one name: the higher price of each kind
        key = _model_key(name)
        held = table.get(key)
        table[key] = pair if held is None else (max(held[0], pair[0]), max(held[1], pair[1]))
    if isinstance(model, str):
        for candidate in _candidates(_model_key(model)):
            if candidate in table:
                return table[candidate]
    if "*" in table:
        return table["*"]
    return (max(p[0] for p in table.values()), max(p[1] for p in table.values()))


_VERSION = re.compile(r"-v\d+(?::\d+)?$")
_SNAPSHOT = re.compile(r"[-@_](?:\d{4}-\d{2}-\d{2}|\d{8})$")


def _model_key(name: str) -> str:
    return name.strip().casefold()


def _candidates(name: str) -> list[str]:
    """``name``, then without its trailing version, then without its trailing snapshot date."""
    found = [name]
    for suffix in (_VERSION, _SNAPSHOT):
        shorter = suffix.sub("", found[-1])
        if shorter and shorter != found[-1]:
            found.append(shorter)
    return found


def reserve(conn: psycopg.Connection[db.Row], *, effect_id: UUID, run_id: UUID, owner: str, model: object,
            input_tokens: int, max_output_tokens: int, settings: Settings, now: datetime | None = None) -> bool:
    """Charges the estimate (``input_tokens`` + ``max_output_tokens``, and their price) to the owner's
    UTC day against both ceilings; False, with nothing charged, when either would be passed."""
    row = db.fetch_one(conn, "usage_ledger_reserve", {
        "effect_id": effect_id, "run_id": run_id, "owner": owner,
        **charge(run_id=run_id, model=model, input_tokens=input_tokens, max_output_tokens=max_output_tokens,
                 settings=settings),
        "now": now})
    return row is not None


def lock_charged(conn: psycopg.Connection[db.Row], effect_ids: Sequence[UUID]) -> None:
    """Locks the stripes these closed effects' settlements charge at this transaction's commit, in
    (owner, day, stripe) order: for a transaction that closed several (the tick's rescue), after every
    other lock it takes (see Lock order)."""
    db.fetch_all(conn, "usage_ledger_lock_charged", {"effect_ids": list(effect_ids)})


def charge(*, run_id: UUID, model: object, input_tokens: int, max_output_tokens: int,
           settings: Settings) -> dict[str, Any]:
    """The parameters of a model call's charge (``usage_ledger_reserve``, ``effects_reserve_charged``):
    the estimate's tokens and price, the owner's daily ceilings, and the stripe tried first — the run's
    own, its id's last byte modulo the 8 stripes."""
    tokens = max(0, input_tokens) + max(0, max_output_tokens)
    cost = price(settings, model, max(0, input_tokens), max(0, max_output_tokens))
    return {"tokens": tokens, "cost_usd": Decimal(f"{cost:.9f}"), "max_tokens": settings.owner_daily_tokens,
            "max_cost_usd": Decimal(f"{settings.owner_daily_cost_usd:.9f}"), "stripe_first": run_id.int % STRIPES}


def priced(usage: Mapping[str, Any], model: object, settings: Settings) -> dict[str, Any]:
    """A call's usage with ``input_tokens``, ``output_tokens`` (from the provider's prompt / completion
    counts) and ``cost_usd`` added: what its effect's settlement charges to the ledger."""
    out = dict(usage)
    input_tokens = _count(usage, "input_tokens", "prompt_tokens")
    output_tokens = _count(usage, "output_tokens", "completion_tokens")
    out["input_tokens"] = input_tokens
    out["output_tokens"] = output_tokens
    out["cost_usd"] = round(price(settings, model, input_tokens, output_tokens), 9)
    out.setdefault("steps", 1)
    return out


def _count(usage: Mapping[str, Any], *keys: str) -> int:
    for key in keys:
        value = usage.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return 0


# -- usage -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Day:
    day: date
    input_tokens: int
    output_tokens: int
    cost_usd: float
    calls: int
    runs: int

    def as_json(self) -> dict[str, Any]:
        return {"day": self.day.isoformat(), "input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "cost_usd": self.cost_usd, "calls": self.calls, "runs": self.runs}


def days(conn: psycopg.Connection[db.Row], *, owner: str, start: date, until: date) -> list[Day]:
    """The owner's usage for each UTC day in ``[start, until)``, oldest first, days without usage as zeros."""
    rows = db.fetch_all(conn, "usage_ledger_days", {"owner": owner, "from": start, "until": until})
    return [Day(r["day"], int(r["input_tokens"]), int(r["output_tokens"]), round(float(r["cost_usd"]), 6),
                int(r["calls"]), int(r["runs"])) for r in rows]


def today(conn: psycopg.Connection[db.Row], *, now: datetime | None = None) -> date:
    """The UTC date of ``now``, by default the database's (the ledger's days are the database's)."""
    row = db.fetch_row(conn, "usage_ledger_today", {"now": now})
    value: date = row["today"]
    return value
