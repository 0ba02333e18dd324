"""The console's static files and the routes that serve them (issue 16), without a browser or a database.

Every console answer carries the strict Content-Security-Policy, ``nosniff`` and ``no-referrer``; only
the files of ``kairos/console`` with a plain name and a known type are served, with their content type;
the page has no inline script, style or handler and its modules never write markup; and every API call
the console makes (each ``call("METHOD", `/v1/...`)`` in its modules) is a route of the OpenAPI
document — the console needs no private endpoint.
"""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from kairos import runtime
from kairos.api.app import handle, openapi_document
from kairos.api.routes import console
from kairos.local import apigw

CONSOLE = Path(__file__).resolve().parents[2] / "layers" / "common" / "kairos" / "console"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "base-uri 'none'; frame-ancestors 'none'; form-action 'none'")
CALL = re.compile(r"""\bcall\(\s*"(GET|POST|PUT|PATCH|DELETE)",\s*(`[^`]*`|"[^"]*")""")


@pytest.fixture(autouse=True)
def settings(monkeypatch: pytest.MonkeyPatch) -> Any:
    for name in ("KAIROS_CONSOLE_ISSUER", "KAIROS_CONSOLE_CLIENT_ID", "KAIROS_CONSOLE_TOKEN_URL",
                 "KAIROS_CONSOLE_AUTHORIZE_URL", "KAIROS_CONSOLE_SCOPES", "KAIROS_PUBLIC_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KAIROS_AUTH", "dev")
    runtime.reset()
    yield
    runtime.reset()


def get(target: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    return dict(handle(apigw.build_event("GET", target, headers or {}, None), None))


def scripts() -> dict[str, str]:
    return {p.name: p.read_text(encoding="utf-8") for p in sorted(CONSOLE.glob("*.js"))}


# --- headers, allow-list ---------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["/console", "/console/", "/console/app.js", "/console/style.css",
                                    "/console/config.json"])
def test_every_console_answer_carries_the_strict_policy(target: str) -> None:
    answer = get(target)
    assert answer["statusCode"] in (200, 308)
    headers = answer["headers"]
    assert headers["Content-Security-Policy"] == CSP
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert headers["Referrer-Policy"] == "no-referrer"


def test_the_root_redirects_under_the_slash_so_relative_imports_resolve() -> None:
    answer = get("/console")
    assert answer["statusCode"] == 308 and answer["headers"]["Location"] == "console/"


def test_every_shipped_file_is_served_with_its_content_type_and_an_etag() -> None:
    shipped = sorted(p.name for p in CONSOLE.iterdir() if p.is_file())
    assert {"index.html", "app.js", "api.js", "auth.js", "style.css", "timeline.js"} <= set(shipped)
    assert sorted(console.files()) == shipped  # nothing else is in the directory
    types = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
             ".css": "text/css; charset=utf-8"}
    for name in shipped:
        answer = get(f"/console/{name}")
        assert answer["statusCode"] == 200, name
        assert answer["headers"]["Content-Type"] == types[Path(name).suffix], name
        assert answer["body"] == (CONSOLE / name).read_text(encoding="utf-8")
        etag = answer["headers"]["ETag"]
        assert answer["headers"]["Cache-Control"] == "no-cache"
        again = get(f"/console/{name}", {"If-None-Match": etag})
        assert again["statusCode"] == 304 and again["body"] == ""
    assert get("/console/")["body"] == (CONSOLE / "index.html").read_text(encoding="utf-8")


@pytest.mark.parametrize("name", ["nope.js", "app.py", "..%2Fapi%2Fapp.py", ".hidden.js", "App.js", "app.js.map",
                                  "index.htm", "config.js"])
def test_a_name_off_the_allow_list_is_the_plain_not_found(name: str) -> None:
    answer = get(f"/console/{name}")
    assert answer["statusCode"] == 404
    assert json.loads(answer["body"])["error"]["code"] == "not_found"


def test_config_says_dev_locally_and_names_no_secret() -> None:
    config = json.loads(get("/console/config.json")["body"])
    assert config["auth"] == "dev" and config["issuer"] is None and config["client_id"] is None


def test_config_and_policy_name_the_issuer_when_deployed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAIROS_AUTH", "jwt")
    monkeypatch.setenv("KAIROS_CONSOLE_ISSUER", "https://cognito-idp.eu-central-1.amazonaws.com/pool")
    monkeypatch.setenv("KAIROS_CONSOLE_CLIENT_ID", "client-123")
    monkeypatch.setenv("KAIROS_CONSOLE_SCOPES", "openid,email")
    monkeypatch.setenv("KAIROS_CONSOLE_TOKEN_URL", "https://kairos-x.auth.eu-central-1.amazoncognito.com/oauth2/token")
    runtime.reset()
    answer = get("/console/config.json")
    config = json.loads(answer["body"])
    assert config["auth"] == "oidc" and config["client_id"] == "client-123" and config["scopes"] == "openid email"
    assert config["issuer"] == "https://cognito-idp.eu-central-1.amazonaws.com/pool"
    connect = re.search(r"connect-src ([^;]+);", answer["headers"]["Content-Security-Policy"])
    assert connect and connect.group(1).split() == [
        "'self'", "https://cognito-idp.eu-central-1.amazonaws.com", "https://kairos-x.auth.eu-central-1.amazoncognito.com"]


def test_deployed_without_a_client_id_the_console_says_it_cannot_sign_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAIROS_AUTH", "jwt")
    runtime.reset()
    assert json.loads(get("/console/config.json")["body"])["auth"] == "unconfigured"


def test_the_console_routes_are_not_in_the_json_api_document() -> None:
    from kairos.api.app import ROUTES

    assert {spec.key for spec in ROUTES if spec.page} == {"GET /console", "GET /console/", "GET /console/{file}"}
    assert not [p for p in openapi_document()["paths"] if p.startswith("/console")]


# --- the page and its modules ------------------------------------------------------------------------


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.open: str | None = None
        self.inline: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self.open = tag

    def handle_endtag(self, tag: str) -> None:
        self.open = None

    def handle_data(self, data: str) -> None:
        if self.open in ("script", "style") and data.strip():
            self.inline.append(data)


def test_the_page_has_no_inline_script_style_or_handler() -> None:
    page = _Page()
    page.feed((CONSOLE / "index.html").read_text(encoding="utf-8"))
    assert page.inline == []
    scripts_ = [attrs for tag, attrs in page.tags if tag == "script"]
    assert scripts_ == [{"type": "module", "src": "app.js"}]
    assert not [tag for tag, _ in page.tags if tag == "style"]
    for tag, attrs in page.tags:
        assert not [a for a in attrs if a.startswith("on") or a == "style"], (tag, attrs)
        for name in ("src", "href"):
            value = attrs.get(name) or ""
            assert not re.match(r"^(https?:)?//", value), f"{tag} loads {value} from elsewhere"


def test_the_modules_never_write_markup_or_evaluate_strings() -> None:
    for name, text in scripts().items():
        text = text.replace('"http://www.w3.org/2000/svg"', "SVG_NS")  # a namespace name, never fetched
        for banned in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function",
                       "setAttribute(\"on", "localStorage", "http://", "https://"):
            assert banned not in text, f"{name} uses {banned}"


def test_the_console_is_small_and_vendors_nothing() -> None:
    total = sum(p.stat().st_size for p in CONSOLE.iterdir())
    assert total < 100_000, total
    for text in scripts().values():
        for spec in re.findall(r"""\bfrom\s+"([^"]+)"|import\(\s*"([^"]+)"\)""", text):
            target = next(s for s in spec if s)
            assert target.startswith("./") and (CONSOLE / target[2:]).is_file(), target


def console_calls() -> set[str]:
    """Every API call of the console as a route key: ``GET /v1/runs/{id}/events``."""
    found: set[str] = set()
    for name, text in scripts().items():
        calls = CALL.findall(text)
        # Every /v1/ path in the modules is the path of a call(...): none escapes this check.
        assert len(calls) == text.count("/v1/"), f"{name}: a /v1/ path outside call(...)"
        for method, literal in calls:
            path = re.sub(r"\$\{qs\(.*?\)\}$", "", literal[1:-1])  # the query string
            path = re.sub(r"\$\{[^}]*\}", "{id}", path).split("?")[0]
            found.add(f"{method} {path}")
    return found


def documented() -> set[str]:
    routes: set[str] = set()
    for path, operations in openapi_document()["paths"].items():
        normalized = re.sub(r"\{[^}]+\}", "{id}", path)
        routes |= {f"{method.upper()} {normalized}" for method in operations}
    return routes


def test_every_api_call_the_console_makes_is_a_documented_route() -> None:
    calls = console_calls()
    # What the pages need, so the scan cannot pass by finding nothing. (A recovery action's control calls
    # the path its diagnosis names — retry among them — held to the route table by test_recovery_actions.)
    assert {"GET /v1/schedules", "GET /v1/schedules/{id}/preview", "POST /v1/schedules/{id}/token",
            "GET /v1/runs/{id}/events", "POST /v1/approvals/{id}/approve", "GET /v1/status",
            "GET /v1/usage", "GET /v1/conversations/{id}/inbox",
            "GET /v1/input-requests", "POST /v1/input-requests/{id}/answer"} <= calls
    undocumented = calls - documented()
    assert undocumented == set(), undocumented


def test_only_the_api_client_and_the_sign_in_fetch() -> None:
    # api.js: call() itself; auth.js: config.json, the issuer's discovery document, its token endpoint.
    fetching = {name: text.count("fetch(") for name, text in scripts().items() if "fetch(" in text}
    assert fetching == {"api.js": 1, "auth.js": 3}, fetching
