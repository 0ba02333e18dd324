"""Owners' secrets: store or replace one of your keys, list their names and references, delete one.

Values go to Secrets Manager under the caller's namespace and never come back; ``kairos.secrets``'
client (and boto3) is first used by these routes.
"""

from __future__ import annotations

from typing import Annotated, Any

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Body

from kairos import secrets
from kairos.api import models
from kairos.api.resolver import JSON, Routes, principal
from kairos.api.routes import ok

router = Routes()


@router.endpoint("PUT", "/v1/secrets/<name>", status=200, model=models.SecretEnvelope, errors=(400, 415, 503),
                 summary="Store or replace one of your keys; answers the reference to give as api_key_secret",
                 has_body=True)
def put_secret(name: str, body: Annotated[models.SecretPut, Body()]) -> Response[dict[str, Any]]:
    stored, _ = secrets.store(principal(), name, body.value)
    return ok(200, models.SecretEnvelope, {"secret": stored.as_json()})


@router.endpoint("GET", "/v1/secrets", status=200, model=models.SecretList, errors=(503,),
                 summary="Your keys' names and references (never their values)")
def list_secrets() -> Response[dict[str, Any]]:
    return ok(200, models.SecretList, {"secrets": [s.as_json() for s in secrets.list_owned(principal())]})


@router.endpoint("DELETE", "/v1/secrets/<name>", status=204, model=models.Empty, errors=(404, 503),
                 summary="Delete one of your keys at once (runs that name it then fail secret_unavailable)")
def delete_secret(name: str) -> Response[None]:
    secrets.delete(principal(), name)
    return Response(status_code=204, content_type=JSON, body=None)
