"""kairos.tick.counts: the tick's totals are a blind sum of the fields each step report marks.

A step report that gains a counted field is summed into the tick's report with no edit to the tick."""

from __future__ import annotations

from dataclasses import dataclass, fields

from kairos.tick import counts, loop
from kairos.tick.counts import counted
from kairos.tick.deliver import DeliverReport
from kairos.tick.fire import FireReport
from kairos.tick.prune import PruneReport
from kairos.tick.repair import RepairReport
from kairos.tick.settle import SettleReport

STEPS = (SettleReport, RepairReport, FireReport, PruneReport, DeliverReport)
# TickReport fields that are not a sum of step fields: the tick derives or measures them itself.
DERIVED = {"batches", "fire_lag_p50_seconds", "fire_lag_max_seconds", "duration_ms", "stopped_for_time"}


@dataclass(frozen=True)
class _SettleWithMore(SettleReport):
    """SettleReport as if a maintainer had added one more counted field (its total: ``released``)."""

    released_again: int = counted("released")


@dataclass(frozen=True)
class _Widgets:
    widgets: int = counted()
    spares: int = counted("widgets")
    full: bool = False  # not counted


def test_a_new_counted_field_on_a_step_report_is_summed_without_an_edit_to_the_tick() -> None:
    # Given two settle passes, one of them reporting through the new field
    passes = [SettleReport(released=2), _SettleWithMore(released=3, released_again=4)]
    # When the tick totals them
    report = loop._Totals(passes, [], []).report(1.0, False)
    # Then the new field's amount is in the total it names
    assert report.released == 2 + 3 + 4


def test_counts_sum_each_marked_field_under_its_total_and_skip_the_rest() -> None:
    assert counts.counts(_Widgets(widgets=2, spares=5, full=True)) == {"widgets": 7}
    assert counts.add_up([(_Widgets, [_Widgets(1, 1), _Widgets(2, 0)])]) == {"widgets": 4}
    assert counts.add_up([(_Widgets, [])]) == {"widgets": 0}  # a step that made no report adds a zero


def test_every_tick_total_is_fed_by_a_step_or_derived_by_the_tick() -> None:
    summed = {name for step in STEPS for name in counts.totals_of(step)}
    tick_fields = {f.name for f in fields(loop.TickReport)}
    assert summed <= tick_fields, f"counted into no TickReport field: {sorted(summed - tick_fields)}"
    unfed = sorted(tick_fields - DERIVED - summed)
    assert tick_fields - DERIVED == summed, f"TickReport fields nobody adds to: {unfed}"


def test_the_steps_add_to_the_totals_the_tick_has_always_reported() -> None:
    # Given one report of each step, every field set to a distinct amount
    settle = SettleReport(schedules=100, settled=1, paused=2, released=3, handoff_failures=4, notes=5, deliveries=6)
    repair = RepairReport(resent=7, rescued=8, requeued=9, abandoned=10, failed=11, cancelled=12,
                          handoff_failures=13, undeliverable=14, approvals_expired=15, slots_released=40)
    fire = FireReport(locked=16, dispatched=17, skipped=18, queued_behind=19, fires_covered=20, completed=21,
                      paused=22, conflicts=23, handoff_failures=24, lags=(1.0, 3.0), db_seconds=0.5, sqs_seconds=0.25)
    prune = PruneReport(webhook_receipts=25, idempotency_receipts=26, runs=27, threads=28, entries=29, payloads=30,
                        steps=31, corpus_rows=32, previews=33, questions=34, reservations=35, full=True)
    deliver = DeliverReport(attempted=36, delivered=37, retried=38, gave_up=39, full=True)
    # When the tick totals them
    report = loop._Totals([settle], [repair], [fire], prune=[prune], deliver=[deliver]).report(12.5, True)
    # Then the flat report is the one the handler returns: every step's count, the prune's content kinds too
    assert report.as_dict() == {
        "settled": 1, "paused": 2 + 22, "released": 3, "slots_released": 40, "resent": 7, "rescued": 8,
        "requeued": 9, "abandoned": 10,
        "failed": 11, "cancelled": 12, "undeliverable": 14, "approvals_expired": 15, "batches": 1, "schedules": 16,
        "dispatched": 17, "skipped": 18, "queued_behind": 19, "fires_covered": 20, "completed": 21, "conflicts": 23,
        "handoff_failures": 4 + 13 + 24, "pruned": 25 + 26, "notes": 5, "notify_delivered": 37, "notify_retried": 38,
        "notify_gave_up": 39, "runs_pruned": 27, "threads_pruned": 28, "entries_pruned": 29, "payloads_pruned": 30,
        "steps_pruned": 31, "corpus_rows_pruned": 32, "previews_pruned": 33, "questions_pruned": 34,
        "reservations_pruned": 35,
        "fire_lag_p50_seconds": 2.0, "fire_lag_max_seconds": 3.0, "fire_db_seconds": 0.5, "fire_sqs_seconds": 0.25,
        "duration_ms": 12.5, "stopped_for_time": True,
    }


def test_a_tick_whose_steps_made_no_report_totals_zeros() -> None:
    report = loop._Totals([], [], []).report(0.0, True).as_dict()
    assert report["fire_db_seconds"] == 0 and report["pruned"] == 0 and report["fire_lag_max_seconds"] is None
