"""The webhook trigger: ``POST /v1/hooks/{token}``, public (the token is the credential).

The body is read raw, any media type, up to ``kairos.webhooks.MAX_BODY_BYTES`` (a larger one is 413
from the library); its nesting is bounded first (``kairos.api.bodies.check_depth``), as for every
JSON body. ``kairos.webhooks.receive`` does the rest — token, signature, idempotency, rate limit, the
occurrence and its run — and commits; the committed run ids then go to SQS through
``kairos.handoff``, shared with the tick. ``kairos.webhooks`` is imported on the first delivery.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.event_handler import Response

from kairos import webhooks
from kairos.api import models
from kairos.api.bodies import check_depth, raw_body
from kairos.api.resolver import Routes
from kairos.api.routes import database, handoff_committed, ok

router = Routes()


@router.endpoint("POST", "/v1/hooks/<token>", status=202, model=models.HookAccepted,
                 errors=(401, 404, 413, 429, 503),
                 summary="Trigger a webhook schedule (no bearer; the token is the credential)", public=True)
def post_hook(token: str) -> Response[dict[str, Any]]:

    event = router.current_event
    body = raw_body(event.raw_event)
    if len(body) <= webhooks.MAX_BODY_BYTES:  # a larger body answers 413 from the library
        check_depth(body.decode("utf-8", errors="replace"))
    delivery = webhooks.Delivery(token=token, body=body,
                                 headers={k.lower(): v for k, v in (event.headers or {}).items()})
    accepted = webhooks.receive(database(), delivery, handoff=handoff_committed)
    return ok(202, models.HookAccepted, accepted.as_json())
