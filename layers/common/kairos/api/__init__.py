"""The HTTP API (API Gateway HTTP API, payload v2): routes in ``app``, models in ``models``, auth in ``auth``.

``kairos.api.app.handle(event, context)`` is the whole API; ``functions/webhook/app.py`` wraps it in the
Powertools decorators and the local stack serves it through ``kairos.apigw``.
"""
