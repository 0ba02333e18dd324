"""The OpenAPI document of the HTTP API, generated from the resolver's routes and models.

Powertools builds the paths, parameters, bodies and responses from the route signatures and
``kairos.api.models``. Three bodies are read raw by design and are described here from their models:
``POST /v1/conversations`` (judged whole by ``conversations.create_from_body``), ``POST
/v1/schedules`` (the strict ``schedules.ScheduleRequest``; the chat-style shorthand it also
accepts is canonicalized before that validation and named in the description) and ``POST
/v1/hooks/{token}`` (any body up to 64 KiB, with its idempotency and signature headers). Powertools'
default 422 schema is replaced by the one error shape, and a 204 is described without content (it has
none). Nothing here reads a request.
"""

from __future__ import annotations

import json
from typing import Any

from aws_lambda_powertools.event_handler import APIGatewayHttpResolver
from aws_lambda_powertools.event_handler.openapi.models import HTTPBearer
from pydantic import BaseModel

import kairos
from kairos import schedules, webhooks
from kairos.api import models

REF = "#/components/schemas/{model}"

_HOOK_HEADERS = [
    ("Idempotency-Key", "Printable ASCII, at most 255 characters. Remembered 24 h: the same key and body answer "
                        "the first response again; the same key with another body answers 422; after 24 h the "
                        "key is new again. A signed schedule dedupes on its scheme's own id instead."),
    ("webhook-id", "Standard Webhooks message id; the key when Idempotency-Key is absent, and always the key "
                   "of a schedule that requires a Standard Webhooks signature (it is what is signed)."),
    ("X-GitHub-Delivery", "GitHub's delivery id (kept across redeliveries); the key when neither header above "
                          "is present, and first for a schedule that requires a GitHub signature."),
    ("webhook-timestamp", "Standard Webhooks: seconds since the epoch, within the schedule's tolerance."),
    ("webhook-signature", "Standard Webhooks: space-separated v1,<base64 HMAC-SHA256> signatures."),
    ("X-Hub-Signature-256", "GitHub: sha256=<hex HMAC-SHA256 of the raw body>."),
]

SHORTHAND = (
    "The strict body is below. Chat-style shorthand is canonicalized first (see kairos.schedules): "
    "`every_seconds` means an interval, a lone `starts_at` means a one-time schedule, `cron` without "
    "`kind` means cron, and a daily UTC cron is stored as a 86,400 s interval. Any other field is refused "
    "with rule `unknown_field`."
)


LOOP_POLICIES = (
    "A goal loop's policies are fixed: catch-up off, overlap skip, mode append, no backfill. catch_up, "
    "overlap and mode are accepted only with those values; a field that would loosen them (or backfill, "
    "agent, signing, corpus, notify) is refused with rule `loop_policy`, any other with `unknown_field`."
)


def document(app: APIGatewayHttpResolver) -> dict[str, Any]:
    schema = app.get_openapi_schema(
        title="Kairos",
        version=kairos.__version__,
        description="Agent prompts on a schedule or a webhook, exactly once per fire.",
        security_schemes={"bearer": HTTPBearer(description="JWT (deployed) or a dev token (local)")},
    )
    doc: dict[str, Any] = schema.model_dump(mode="json", by_alias=True, exclude_none=True)
    components = doc.setdefault("components", {}).setdefault("schemas", {})
    _describe_schedule_body(doc, components)
    _describe_conversation_body(doc, components)
    _describe_body(doc, components, "/v1/loops", models.LoopCreate, description=LOOP_POLICIES)
    _describe_hook(doc)
    _describe_idempotent_creates(doc)
    _no_content(doc)
    for name in ("HTTPValidationError", "ValidationError", "Empty"):
        if f'"#/components/schemas/{name}"' not in _text(doc["paths"]):
            components.pop(name, None)
    return doc


def _describe_schedule_body(doc: dict[str, Any], components: dict[str, Any]) -> None:
    _describe_body(doc, components, "/v1/schedules", schedules.ScheduleRequest, description=SHORTHAND)


def _describe_conversation_body(doc: dict[str, Any], components: dict[str, Any]) -> None:
    _describe_body(doc, components, "/v1/conversations", models.ConversationCreate)


def _describe_body(doc: dict[str, Any], components: dict[str, Any], path: str, model: type[BaseModel], *,
                   description: str | None = None) -> None:
    """A POST route that reads its body itself (so the library judges it whole) gets ``model`` as its
    documented request body, with the model's nested definitions among the components."""
    body_schema = model.model_json_schema(ref_template=REF)
    for name, definition in body_schema.pop("$defs", {}).items():
        components.setdefault(name, definition)
    components[model.__name__] = body_schema
    request_body: dict[str, Any] = {"required": True}
    if description is not None:
        request_body["description"] = description
    request_body["content"] = {"application/json": {"schema": {"$ref": REF.format(model=model.__name__)}}}
    doc["paths"][path]["post"]["requestBody"] = request_body


def _describe_hook(doc: dict[str, Any]) -> None:
    operation = doc["paths"]["/v1/hooks/{token}"]["post"]
    operation["description"] = (
        f"The token is the credential (no bearer). Bodies up to {webhooks.MAX_BODY_BYTES} bytes; a paused, "
        "cancelled or unknown hook answers 404; over the schedule's rate limit (rate_limited) or the owner's "
        "queue cap (queue_full, nothing recorded), 429 with Retry-After."
    )
    operation.setdefault("parameters", []).extend(
        {"name": name, "in": "header", "required": False, "description": text, "schema": {"type": "string"}}
        for name, text in _HOOK_HEADERS
    )
    operation["requestBody"] = {
        "required": False,
        "description": "Any body; stored as the run's payload (JSON, or {\"raw\": text}).",
        "content": {"application/json": {"schema": {}}},
    }
    operation["responses"]["429"]["headers"] = {
        "Retry-After": {"description": "seconds until the hook accepts again", "schema": {"type": "integer"}},
    }


def _describe_idempotent_creates(doc: dict[str, Any]) -> None:
    for path in ("/v1/schedules", "/v1/conversations", "/v1/loops"):
        doc["paths"][path]["post"].setdefault("parameters", []).append({
            "name": "Idempotency-Key", "in": "header", "required": False, "schema": {"type": "string"},
            "description": "Printable ASCII, at most 255 characters (send a UUID). For 24 h, per caller: a retry "
                           "with the same body answers the first response again (a webhook's token included), "
                           "with another body 422; nothing is created twice.",
        })


def _no_content(doc: dict[str, Any]) -> None:
    """A 204 answers no body (``kairos.api.app`` sends none): its response describes no content."""
    for operations in doc["paths"].values():
        for operation in operations.values():
            answer = operation.get("responses", {}).get("204")
            if answer is not None:
                operation["responses"]["204"] = {"description": "No Content"}


def _text(value: Any) -> str:
    return json.dumps(value)
