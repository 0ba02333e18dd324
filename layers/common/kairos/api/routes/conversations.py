"""Conversations: create one with its agent, list them, read one with its transcript, read its inbox
notes, post a chat turn (``kairos.chat``).

``POST /v1/conversations`` reads its body raw: ``kairos.conversations.create_from_body`` judges it
whole (undeclared fields, the title and every agent problem in one answer); the OpenAPI document
describes it from ``kairos.api.models.ConversationCreate``.
"""

from __future__ import annotations

from typing import Annotated, Any
from uuid import UUID

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Body, Query

from kairos import chat, conversations, pages
from kairos.api import models
from kairos.api.resolver import Routes, principal
from kairos.api.routes import BEFORE, LIMIT, database, idempotent, ok, parse_id, send_committed

router = Routes()


@router.endpoint("POST", "/v1/conversations", status=201, model=models.ConversationEnvelope, errors=(400, 415),
                 summary="Create a conversation with an agent", has_body=True)
def create_conversation(
    body: Annotated[dict[str, Any], Body(description="ConversationCreate")],
) -> Response[dict[str, Any]]:
    owner = principal()

    def create(conn: Any) -> Response[dict[str, Any]]:
        created = conversations.create_from_body(conn, owner=owner, raw=body)
        transcript = conversations.transcript(conn, created.id, owner=owner)
        return ok(201, models.ConversationEnvelope, {"conversation": transcript.as_json()})

    with database().transaction() as conn:
        return idempotent(conn, owner, router.current_event.raw_event, body, create)


@router.endpoint("GET", "/v1/conversations", status=200, model=models.ConversationList, errors=(),
                 summary="The caller's conversations (run threads included unless threads=false), newest first, "
                         "without entries, in keyset pages (pass next_before as before)")
def list_conversations(
    threads: Annotated[bool, Query(description="false: only the conversations you created, not the threads "
                                               "that fork and fresh runs made")] = True,
    before: BEFORE = None,
    limit: LIMIT = pages.LIMIT_DEFAULT,
) -> Response[dict[str, Any]]:
    owner = principal()
    with database().transaction() as conn:
        found, next_before = conversations.page(conn, owner=owner, before=before, limit=limit, threads=threads)
    return ok(200, models.ConversationList,
              {"conversations": [c.summary_json() for c in found], "next_before": next_before})


@router.endpoint("GET", "/v1/conversations/<id>", status=200, model=models.ConversationEnvelope, errors=(404,),
                 summary="A conversation with its transcript")
def get_conversation(id: str) -> Response[dict[str, Any]]:
    owner = principal()
    conversation_id = parse_id(id, "conversation")
    with database().transaction() as conn:
        transcript = conversations.transcript(conn, conversation_id, owner=owner)
    return ok(200, models.ConversationEnvelope, {"conversation": transcript.as_json()})


@router.endpoint("GET", "/v1/conversations/<id>/inbox", status=200, model=models.Inbox, errors=(404,),
                 summary="The conversation's inbox notes, newest first")
def get_inbox(id: str) -> Response[dict[str, Any]]:
    owner = principal()
    conversation_id = parse_id(id, "conversation")
    with database().transaction() as conn:
        notes = conversations.inbox(conn, conversation_id, owner=owner)
    return ok(200, models.Inbox, {"notes": [n.as_json() for n in notes]})


@router.endpoint("POST", "/v1/conversations/<id>/messages", status=202, model=models.HookAccepted,
                 errors=(400, 404, 415), has_body=True,
                 summary="A chat turn: the message becomes a chat run that appends the agent's answer")
def post_message(id: str, body: Annotated[dict[str, Any], Body(description='{"content": "..."}')],
                 ) -> Response[dict[str, Any]]:

    owner = principal()
    conversation_id = parse_id(id, "conversation")
    sendable: list[UUID] = []

    def create(conn: Any) -> Response[dict[str, Any]]:
        turn = chat.post(conn, conversation_id, owner=owner, raw=body)
        if not turn.waiting:
            sendable.append(turn.run_id)
        return ok(202, models.HookAccepted, turn.as_json())

    with database().transaction() as conn:
        response = idempotent(conn, owner, router.current_event.raw_event,
                              {"conversation_id": str(conversation_id), "body": body}, create)
    send_committed(sendable)
    return response
