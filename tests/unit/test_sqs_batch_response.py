"""The run function's batch response is built by ``kairos.execution.sqs`` itself; it must be the one
Powertools' ``BatchProcessor`` + ``process_partial_response`` give for the same outcomes (the library it
replaced on the hot path), one record at a time and with the records executing at once."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import pytest
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

from kairos.execution import sqs
from kairos.settings import Settings
from tests.support.aws import LambdaContext, sqs_event

# What each record's handling does, by its body: succeed, fail (retried by SQS) or ask for redelivery.
OUTCOMES = ["ok", "fail", "ok", "redeliver", "fail", "ok", "ok", "fail"]


def _outcome(record: SQSRecord, **_: Any) -> None:
    kind = record.body.split(":")[0]
    if kind == "fail":
        raise ValueError("the run's handling failed")
    if kind == "redeliver":
        raise sqs.RedeliverRecord("too little time left")


@pytest.mark.parametrize("concurrency", [1, 10])
@pytest.mark.parametrize("duplicate", [False, True])
def test_the_batch_response_is_the_one_powertools_gives(monkeypatch: pytest.MonkeyPatch, concurrency: int,
                                                        duplicate: bool) -> None:
    event = sqs_event(*(f"{kind}:{uuid.uuid4()}" for kind in OUTCOMES))
    if duplicate:  # SQS may hand one message twice in a batch: same messageId
        event["Records"].append(dict(event["Records"][1]))
    monkeypatch.setattr(sqs, "handle_record", _outcome)
    settings = dataclasses.replace(Settings(), run_concurrency_per_invocation=concurrency)

    ours = sqs.handle_batch(event, LambdaContext(), db=None, settings=settings,  # type: ignore[arg-type]
                            send_retry=lambda *_: None, send_released=lambda *_: None)

    processor = BatchProcessor(event_type=EventType.SQS, raise_on_entire_batch_failure=False)
    theirs = process_partial_response(event=event, record_handler=_outcome, processor=processor,
                                      context=LambdaContext())
    assert ours == dict(theirs)
    assert len(ours["batchItemFailures"]) == OUTCOMES.count("fail") + OUTCOMES.count("redeliver") + duplicate
