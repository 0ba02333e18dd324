"""The HTTP API (API Gateway HTTP API, payload v2): ``app`` (the resolver and ``handle``), ``resolver``
(the resolver class, the routers' base and the route table), ``routes`` (one router per resource),
``errors`` (the one error shape), ``bodies`` (the body screen), ``models``, ``auth`` and ``openapi``.

``kairos.api.app.handle(event, context)`` is the whole API; ``functions/webhook/app.py`` wraps it in the
Powertools decorators and the local stack serves it through ``kairos.local.apigw``.
"""
