"""Corpus runs: progress, records, pause and resume (docs/api.md "Corpus runs"; ``kairos.corpus``).

``GET /v1/runs/{id}/corpus`` answers the phase, coverage, partitions by state and export handles;
``/corpus/records?after=&limit=`` the canonical records in (kind, id) keyset pages. ``POST
/v1/runs/{id}/pause`` / ``/resume`` answer 202 with the run; 409 ``not_corpus_run`` / ``not_paused``
when they do not apply. A run that is not the caller's, or not a corpus run, is the same 404.
"""

from __future__ import annotations

from typing import Annotated, Any

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Query

from kairos.api import models
from kairos.api.resolver import Routes, principal
from kairos.api.routes import database, jsonable, ok, parse_id, send_committed
from kairos.runs import corpus_control, corpus_progress

router = Routes()


@router.endpoint("GET", "/v1/runs/<id>/corpus", status=200, model=models.CorpusEnvelope, errors=(404,),
                 summary="A corpus run's phase, coverage, partitions by state and export handles")
def get_corpus(id: str) -> Response[dict[str, Any]]:

    owner = principal()
    run_id = parse_id(id, "run")
    with database().transaction() as conn:
        progress = corpus_progress.progress(conn, run_id, owner=owner)
    return ok(200, models.CorpusEnvelope, {"corpus": jsonable(progress)})


@router.endpoint("GET", "/v1/runs/<id>/corpus/records", status=200, model=models.CorpusRecordPage,
                 errors=(404, 422), summary="A corpus run's canonical records in (kind, id) order, keyset pages")
def get_corpus_records(
    id: str,
    after: Annotated[str | None, Query(max_length=2048, description="next_after of the previous page")] = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="capped at 200")] = 50,
) -> Response[dict[str, Any]]:

    owner = principal()
    run_id = parse_id(id, "run")
    with database().transaction() as conn:
        page = corpus_progress.records(conn, run_id, owner=owner, after=after, limit=limit)
    return ok(200, models.CorpusRecordPage, page)


@router.endpoint("POST", "/v1/runs/<id>/pause", status=202, model=models.RunEnvelope, errors=(404, 409),
                 summary="Pause a corpus run at its next partition boundary (queued: at once)")
def pause_run(id: str) -> Response[dict[str, Any]]:

    owner = principal()
    run_id = parse_id(id, "run")
    with database().transaction() as conn:
        run = corpus_control.pause(conn, run_id, owner=owner)
    return ok(202, models.RunEnvelope, {"run": run})


@router.endpoint("POST", "/v1/runs/<id>/resume", status=202, model=models.RunEnvelope, errors=(404, 409),
                 summary="Resume a paused corpus run; it keeps everything it committed")
def resume_run(id: str) -> Response[dict[str, Any]]:

    owner = principal()
    run_id = parse_id(id, "run")
    with database().transaction() as conn:
        resumed = corpus_control.resume(conn, run_id, owner=owner)
    send_committed([run_id] if resumed.send else [])
    return ok(202, models.RunEnvelope, {"run": resumed.run})
