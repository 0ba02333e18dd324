"""The operator console: static files shipped in the layer (``kairos/console/``), served without auth.

``GET /console`` redirects to ``/console/`` (so the page's relative module imports resolve under it);
``GET /console/`` answers ``index.html``; ``GET /console/{file}`` answers one file of the allow-list —
the files of ``kairos/console`` whose names are plain (``[a-z0-9-]+``) and whose extension has a
content type below; any other name is the same 404 as an unknown route. ``GET /console/config.json``
tells the page how to sign in: ``dev`` (ask for a bearer token) or ``oidc`` with the issuer the JWT
authorizer trusts, the console's client id and scopes (``KAIROS_CONSOLE_*``, ``kairos.settings``).

Every answer carries a strict Content-Security-Policy (no inline script or style, connections only to
this origin and the issuer), ``nosniff``, ``no-referrer`` and ``frame-ancestors 'none'``; files carry an
ETag and ``Cache-Control: no-cache`` (revalidated on every load, answered 304 when unchanged), so a
deploy is never hidden behind a stale module.

The files are static: the console holds no secret and makes no decision; it calls only documented
routes of the API with the user's token (``tests/unit/test_console.py`` checks both).
"""

from __future__ import annotations

import hashlib
import json
import re
from functools import lru_cache
from importlib import resources
from typing import Any
from urllib.parse import urlsplit

from aws_lambda_powertools.event_handler import Response

from kairos import runtime
from kairos.api.resolver import Routes
from kairos.errors import NotFound

router = Routes()

CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
_NAME = re.compile(r"^[a-z0-9-]+(\.[a-z]+)$")


def csp(*sign_in: str | None) -> str:
    """The Content-Security-Policy of every console answer; the origins of ``sign_in`` (the issuer, its
    token endpoint) may be fetched, nothing else but this origin."""
    connect = "'self'"
    for url in sign_in:
        if url:
            parts = urlsplit(url)
            origin = f"{parts.scheme}://{parts.netloc}"
            if origin not in connect:
                connect += f" {origin}"
    return ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
            f"connect-src {connect}; base-uri 'none'; frame-ancestors 'none'; form-action 'none'")


def _headers(content_type: str, **extra: str) -> dict[str, str]:
    settings = runtime.settings()
    return {
        "Content-Type": content_type,
        "Content-Security-Policy": csp(settings.console_issuer, settings.console_token_url),
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-cache",
        **extra,
    }


@lru_cache(maxsize=1)
def files() -> dict[str, tuple[str, str, str]]:
    """The allow-list: file name -> (content type, text, ETag), read once per container."""
    found: dict[str, tuple[str, str, str]] = {}
    for entry in resources.files("kairos").joinpath("console").iterdir():
        match = _NAME.match(entry.name)
        if match and match.group(1) in CONTENT_TYPES and entry.is_file():
            text = entry.read_text(encoding="utf-8")
            etag = '"' + hashlib.sha256(text.encode()).hexdigest()[:20] + '"'
            found[entry.name] = (CONTENT_TYPES[match.group(1)], text, etag)
    return found


def _file(name: str) -> Response[str]:
    known = files().get(name)
    if known is None:
        raise NotFound("route")
    content_type, text, etag = known
    if_none_match = (router.current_event.headers or {}).get("if-none-match")
    if if_none_match == etag:
        return Response(status_code=304, content_type=content_type, body="", headers=_headers(content_type, ETag=etag))
    return Response(status_code=200, content_type=content_type, body=text, headers=_headers(content_type, ETag=etag))


def config() -> dict[str, Any]:
    """How the page signs in (no secret: a public OIDC client with PKCE). The page calls the API on
    its own origin (``connect-src 'self'``), so no API base is configured."""
    settings = runtime.settings()
    oidc = settings.auth == "jwt" and bool(settings.console_issuer and settings.console_client_id)
    return {
        "auth": "oidc" if oidc else ("dev" if settings.auth == "dev" else "unconfigured"),
        "issuer": settings.console_issuer if oidc else None,
        "client_id": settings.console_client_id if oidc else None,
        "scopes": settings.console_scopes,
        "authorization_endpoint": settings.console_authorize_url if oidc else None,
        "token_endpoint": settings.console_token_url if oidc else None,
    }


@router.page("/console", summary="The console (redirects to /console/)")
def get_console_root() -> Response[str]:
    return Response(status_code=308, content_type="text/plain; charset=utf-8", body="",
                    headers=_headers("text/plain; charset=utf-8", Location="console/"))


@router.page("/console/", summary="The console's page")
def get_console_index() -> Response[str]:
    return _file("index.html")


@router.page("/console/<file>", summary="One of the console's static files, or its sign-in configuration")
def get_console_file(file: str) -> Response[str]:
    if file == "config.json":
        body = json.dumps(config(), separators=(",", ":"))
        return Response(status_code=200, content_type="application/json", body=body,
                        headers=_headers("application/json"))
    return _file(file)
