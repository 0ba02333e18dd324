"""``observability.EmfProvider`` writes the EMF lines Powertools' ``AmazonCloudWatchEMFProvider`` writes,
and raises its errors, for every kind of ``add_metric`` and ``flush_metrics``: the run path's counts,
repeated and several names, float values, units as text, other resolutions, untrimmed and invalid
names, invalid values and units, a full set of 100 metrics or values, dimensions and metadata, metrics
disabled, nothing to flush, and Powertools' debug logging on."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from typing import Any

import pytest
from aws_lambda_powertools.metrics import MetricResolution, MetricUnit
from aws_lambda_powertools.metrics.provider.cloudwatch_emf.cloudwatch import AmazonCloudWatchEMFProvider

from kairos.observability import NAMESPACE, SERVICE, EmfProvider, metrics

Op = Callable[[AmazonCloudWatchEMFProvider], Any]


def _add(name: Any, unit: Any, value: Any, resolution: Any = 60) -> Op:
    return lambda p: p.add_metric(name=name, unit=unit, value=value, resolution=resolution)


CASES: dict[str, list[Op]] = {
    "a run": [_add("Claims", MetricUnit.Count, 1), _add("RunSucceeded", MetricUnit.Count, 1)],
    "repeated": [_add("Claims", MetricUnit.Count, 1)] * 3 + [_add("LeasesLost", MetricUnit.Count, 2)],
    "floats and units": [_add("FireLagSeconds", MetricUnit.Seconds, 1.25), _add("TickDurationMs",
                         MetricUnit.Milliseconds, 12), _add("FireLagSeconds", MetricUnit.Seconds, 0)],
    "text unit": [_add("WebhooksAccepted", "Count", 1), _add("Claims", MetricUnit.Count, 1)],
    "resolution": [_add("Claims", MetricUnit.Count, 1, 1), _add("Rescues", MetricUnit.Count, 1,
                                                               MetricResolution.High),
                   _add("Claims", MetricUnit.Count, 1)],
    "bool and big": [_add("Claims", MetricUnit.Count, True), _add("RunsPruned", MetricUnit.Count, 10**12)],
    "untrimmed": [_add(" Claims ", MetricUnit.Count, 1), _add("Claims", MetricUnit.Count, 1)],
    "dimension and metadata": [_add("Claims", MetricUnit.Count, 1), lambda p: p.add_dimension("owner", "o-1"),
                               lambda p: p.add_metadata("run_id", "r-1")],
    "text escaped": [_add("Claims\u00e9 \"q\"", "Count", 1), lambda p: p.add_dimension("owner\t", "ô-1\n\u2603")],
    "a dimension named like a metric": [_add("Claims", MetricUnit.Count, 1), lambda p: p.add_dimension("Claims", "x")],
    "the EMF key as a name": [_add("_aws", MetricUnit.Count, 1)],
    "dimension sets": [_add("Claims", MetricUnit.Count, 1), lambda p: p.add_dimensions(owner="o-1", mode="fork")],
    "not finite": [_add("FireLagSeconds", MetricUnit.Seconds, float("inf")),
                   _add("TickDurationMs", MetricUnit.Milliseconds, float("nan"))],
    "no service dimension": [lambda p: setattr(p, "service", None), _add("Claims", MetricUnit.Count, 1)],
    "full set of names": [_add(f"M{n}", MetricUnit.Count, n) for n in range(130)],
    "full set of values": [_add("Claims", MetricUnit.Count, n) for n in range(230)],
}
ERRORS: list[Op] = [_add("", MetricUnit.Count, 1), _add("x" * 256, MetricUnit.Count, 1),
                    _add("Claims", MetricUnit.Count, "1"), _add("Claims", "Bogus", 1),
                    _add("Claims", MetricUnit.Count, 1, 30), _add("   ", MetricUnit.Count, 1)]


# The cases EmfProvider writes as text (``_line``); every other case is the JSON encoder's.
AS_TEXT = {"a run", "repeated", "floats and units", "text unit", "resolution", "bool and big", "untrimmed",
           "text escaped", "no service dimension"}  # a full set's own line is the encoder's too


def _pair() -> tuple[AmazonCloudWatchEMFProvider, EmfProvider]:
    made = []
    for kind in (AmazonCloudWatchEMFProvider, EmfProvider):
        provider = kind(namespace=NAMESPACE, service=SERVICE)
        provider.timestamp = 1767592801500  # Powertools stamps each line with the time of its writing
        made.append(provider)
    return made[0], made[1]  # type: ignore[return-value]


def _written(provider: AmazonCloudWatchEMFProvider, ops: list[Op], capsys: pytest.CaptureFixture[str]) -> str:
    for op in ops:
        op(provider)
    provider.flush_metrics()
    return capsys.readouterr().out


@pytest.mark.parametrize("case", CASES)
def test_the_lines_are_powertools(case: str, capsys: pytest.CaptureFixture[str]) -> None:
    default, fast = _pair()
    capsys.readouterr()
    expected = _written(default, CASES[case], capsys)
    assert _written(fast, CASES[case], capsys) == expected
    assert expected.count("\n") >= 1
    # And again, after the flush cleared the set (a warm container's next invocation)
    assert _written(fast, CASES[case], capsys) == _written(default, CASES[case], capsys)


@pytest.mark.parametrize("case", CASES)
def test_the_common_sets_are_written_as_text_and_the_rest_by_the_encoder(
        case: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _, fast = _pair()
    encoded = []
    serialize = fast.serialize_metric_set
    monkeypatch.setattr(fast, "serialize_metric_set", lambda: encoded.append(1) or serialize())
    _written(fast, CASES[case], capsys)
    assert (encoded == []) == (case in AS_TEXT)


@pytest.mark.parametrize("op", ERRORS, ids=range(len(ERRORS)))
def test_an_invalid_metric_raises_powertools_error(op: Op) -> None:
    raised = []
    for provider in _pair():
        with pytest.raises(Exception) as error:  # compared between the two below
            op(provider)
        raised.append((type(error.value), str(error.value)))
    assert raised[0] == raised[1]


def test_disabled_metrics_and_an_empty_flush_are_powertools(monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    for provider in _pair():
        with pytest.warns(UserWarning, match="No application metrics to publish"):
            provider.flush_metrics()
        with pytest.raises(Exception, match="Must contain at least one metric"):
            provider.flush_metrics(raise_on_empty_metrics=True)
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "true")
    capsys.readouterr()
    for provider in _pair():
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert _written(provider, CASES["a run"], capsys) == ""
        assert provider.metric_set  # Powertools keeps a disabled set
    monkeypatch.delenv("POWERTOOLS_METRICS_DISABLED")


def test_with_powertools_debug_logging_on_the_lines_and_debug_lines_are_powertools(
        capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    written = []
    for provider in _pair():
        capsys.readouterr()
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="aws_lambda_powertools.metrics.provider.cloudwatch_emf"):
            line = _written(provider, CASES["a run"], capsys)
        written.append((line, [r.getMessage() for r in caplog.records]))
    assert written[0] == written[1]
    assert written[0][1]


def test_the_metrics_object_writes_through_the_provider_with_its_own_sets() -> None:
    provider = metrics.provider
    assert type(provider) is EmfProvider
    assert provider.metric_set is metrics.metric_set and provider.dimension_set is metrics.dimension_set
    assert provider.metadata_set is metrics.metadata_set
    assert provider.default_dimensions is metrics.default_dimensions
    assert (provider.namespace, provider.service, provider.function_name) == (NAMESPACE, SERVICE, None)
