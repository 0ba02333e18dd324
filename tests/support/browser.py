"""The console's browser tests' fixtures (registered by ``tests/browser/conftest.py``) and helpers:
``kairos dev`` once per session on a free port, a fake OpenAI-compatible model server the agents
point at, and Playwright driving Debian's headless chromium.

The model server answers by the first segment of its path, so each test picks its agent's behaviour
through ``base_url`` (one server, no shared script to race on):

* ``/ok/v1`` answers at once; ``/slow/v1`` holds each request until the test opens ``model.gate``
  (so a run stays ``running`` while the page watches); ``/fail/v1`` answers 401 (a failed run with a
  diagnosis); ``/tool/v1`` asks for one ``http_post`` tool call to ``/target/hook`` on the same server
  and, once the transcript carries the tool's result, answers "Posted."; ``/goal/v1`` is a goal
  loop's agent: it reports ``needs_input`` with a question, and once it has the answer, ``complete``.

Chromium: ``/usr/bin/chromium`` (``scripts/test`` installs Debian's package when it is missing);
Playwright's own browser download is never used. Without it the tests skip locally and fail in CI.
Screenshots and traces go to ``tests/browser/artifacts`` (gitignored).
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.support.output import reader, stop_dev, wait_for
from tests.support.streaming import chunks, event

CHROMIUM = os.environ.get("KAIROS_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[1] / "browser" / "artifacts"
TOKEN = "dev-token-alice"
MODEL_KEY = "sk-browser-not-a-real-key"


# --- the fake model ------------------------------------------------------------------------------------


@dataclass
class Model:
    port: int = 0
    gate: threading.Event = field(default_factory=threading.Event)
    hooks: list[bytes] = field(default_factory=list)
    # The "stream" scenario streams "Good " and then holds its stream open until this is set.
    stream_gate: threading.Event = field(default_factory=threading.Event)

    def base_url(self, scenario: str) -> str:
        return f"http://127.0.0.1:{self.port}/{scenario}/v1"

    def agent(self, scenario: str, **extra: Any) -> dict[str, Any]:
        return {"executor": "openai", "model": "gpt-browser", "system": "You are terse.",
                "base_url": self.base_url(scenario), "api_key_secret": "env:KAIROS_BROWSER_MODEL_KEY",
                "max_tokens": 64, **extra}


def _completion(message: dict[str, Any]) -> bytes:
    return json.dumps({
        "id": "chatcmpl-browser", "object": "chat.completion",
        "choices": [{"index": 0, "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
                     "message": message}],
        "usage": {"prompt_tokens": 21, "completion_tokens": 7, "total_tokens": 28},
    }).encode()


def _answer(model: Model, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
    scenario = path.strip("/").split("/")[0]
    if scenario == "target":
        model.hooks.append(json.dumps(body).encode())
        return 200, b'{"ok": true}'
    if scenario == "fail":
        return 401, b'{"error": {"type": "invalid_api_key", "message": "no"}}'
    if scenario == "slow":
        model.gate.wait(timeout=60)
    if scenario == "hang":  # answers only after any run's runtime limit of a few seconds
        threading.Event().wait(timeout=20)
    if scenario == "tool" and not any(m.get("role") == "tool" for m in body.get("messages", [])):
        call = {"id": "post-1", "type": "function", "function": {
            "name": "http_post",
            "arguments": json.dumps({"url": f"http://127.0.0.1:{model.port}/target/hook", "body": {"order": 42}})}}
        return 200, _completion({"role": "assistant", "content": None, "tool_calls": [call]})
    if scenario == "goal":  # a goal loop's run: asks its owner first, then reports the goal complete
        answered = any(m.get("role") == "tool" for m in body.get("messages", []))
        report = ({"disposition": "complete", "summary": "Closed the stale issues"} if answered else
                  {"disposition": "needs_input", "summary": "Found 3 stale issues",
                   "question": "Close the 3 stale issues?"})
        call = {"id": "goal-2" if answered else "goal-1", "type": "function",
                "function": {"name": "goal_report", "arguments": json.dumps(report)}}
        return 200, _completion({"role": "assistant", "content": None, "tool_calls": [call]})
    text = "Posted." if scenario == "tool" else "Good morning from the fake model."
    return 200, _completion({"role": "assistant", "content": text})


def _stream(handler: BaseHTTPRequestHandler, model: Model) -> None:
    """A streamed answer, "Good morning, Ada.": its first piece, then (once the test let it go) the rest."""
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.send_header("Connection", "close")
    handler.end_headers()
    for i, frame in enumerate([*(event(c) for c in chunks(["Good ", "morning", ", Ada."])), b"data: [DONE]\n\n"]):
        if i == 2:
            model.stream_gate.wait(timeout=60)
        handler.wfile.write(frame)
        handler.wfile.flush()
    handler.close_connection = True


@pytest.fixture(scope="session")
def model() -> Iterator[Model]:
    state = Model()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            request = json.loads(raw or b"{}")
            if self.path.strip("/").startswith("stream/") and request.get("stream") is True:
                _stream(self, state)
                return
            status, body = _answer(state, self.path, request)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield state
    finally:
        state.gate.set()
        server.shutdown()
        server.server_close()


# --- kairos dev ----------------------------------------------------------------------------------------


@dataclass
class Stack:
    base: str  # http://127.0.0.1:<port>
    console: str  # the console URL kairos dev printed
    hook_url: str  # the demo webhook (echo agent)
    log: list[str]

    def api(self, method: str, path: str, body: Any = None) -> Any:
        """One API call as alice (the console's user), JSON in and out; a non-2xx fails the test."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method, headers={
            "Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read() or b"{}")

    def hook(self, url: str, body: Any) -> str:
        request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return str(json.loads(response.read())["run_id"])


@pytest.fixture(scope="session")
def stack(model: Model) -> Iterator[Stack]:
    """``kairos dev`` as a user starts it (fresh directory, free port, 1 s tick), its agents allowed to
    reach the fake model on 127.0.0.1 with the operator's shared key."""
    # Not under pytest's 0700 temporary root: the embedded PostgreSQL runs as its own user, which must
    # reach its data directory.
    cwd = Path(tempfile.mkdtemp(prefix="kairos-console-"))
    cwd.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "AWS_ENDPOINT_URL", "RUN_QUEUE_URL")}
    env.update({"PYTHONUNBUFFERED": "1", "KAIROS_BROWSER_MODEL_KEY": MODEL_KEY,
                "KAIROS_SHARED_SECRETS": "env:KAIROS_BROWSER_MODEL_KEY@http://127.0.0.1:*",
                "KAIROS_EGRESS_ALLOW": "127.0.0.1"})
    proc = subprocess.Popen(
        [sys.executable, "-m", "kairos", "dev", "--port", "0", "--tick-seconds", "1", "--data-dir", "state"],
        cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue[str] = queue.Queue()
    log: list[str] = []
    threading.Thread(target=reader, args=(proc.stdout, lines, log), daemon=True).start()
    try:
        console = wait_for(lines, r"^console\s+(\S+)", log).group(1)
        hook_url = wait_for(lines, r"webhook URL \(kept across restarts\): (\S+)", log).group(1)
        wait_for(lines, r"^running ", log)
        yield Stack(base=console.split("/console/")[0], console=console, hook_url=hook_url, log=log)
    finally:
        stop_dev(proc)
        shutil.rmtree(cwd, ignore_errors=True)


# --- the browser ---------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        message = f"{CHROMIUM} is missing: apt-get install -y chromium (scripts/test does, as root)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    playwright_api = pytest.importorskip("playwright.sync_api", reason="pip install -e '.[dev]' (playwright)")
    args = ["--no-sandbox"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
    # A run's next state comes from kairos dev's 1 s tick and worker on a shared machine: expectations
    # wait up to 20 s for it (they return as soon as it holds; Playwright's default is 5 s).
    playwright_api.expect.set_options(timeout=20_000)
    with playwright_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=args)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser: Any, stack: Stack, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A fresh tab (its own session storage: signed out) at 1280 px; a screenshot of the end state is
    kept in the artifacts as <test name>.png. A script error or a CSP refusal in the page fails the test."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    tab = context.new_page()
    errors: list[str] = []
    tab.on("pageerror", lambda error: errors.append(str(error)))
    # The strict policy must refuse nothing the console itself does.
    tab.on("console", lambda m: m.type == "error" and "Content Security Policy" in m.text and errors.append(m.text))
    try:
        yield tab
    finally:
        ARTIFACTS.mkdir(exist_ok=True)
        try:
            tab.screenshot(path=str(ARTIFACTS / f"{request.node.name}.png"), full_page=True)
        except Exception:  # a screenshot is evidence, never the verdict
            pass
        context.close()
    assert errors == [], errors


def sign_in(page: Any, stack: Stack, fragment: str = "#/schedules") -> None:
    """Signs in through the console's own form, landing on ``fragment`` once the API has answered it.

    The form goes away as soon as it is submitted, whatever the API then says of the token: the page
    drawn from the API's answer (anything in the view) is what shows the sign-in held."""
    from playwright.sync_api import expect

    page.goto(stack.console + fragment)
    page.fill("#token", TOKEN)
    page.click("#signin button[type=submit]")
    expect(page.locator("main > .view > *").first).to_be_attached()
    expect(page.locator("#signin")).to_have_count(0)


def keep(page: Any, name: str) -> Path:
    """A screenshot into the artifacts (the README's come from here)."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path), full_page=False)
    return path


# --- a fake OIDC provider ---------------------------------------------------------------------------------


@dataclass
class Provider:
    """An OIDC issuer on 127.0.0.1 for the console's PKCE sign-in: discovery, ``/authorize`` (redirects
    straight back with a code, as a signed-in user's provider would) and ``/token`` (checks the client,
    the code, the redirect URI and that SHA-256 of the verifier is the challenge it was given)."""

    client_id: str = "console-test"
    access_token: str = "oidc-access-token-1"
    port: int = 0
    challenges: dict[str, tuple[str, str]] = field(default_factory=dict)  # code -> (challenge, redirect uri)
    exchanged: list[str] = field(default_factory=list)  # codes exchanged with a matching verifier

    @property
    def issuer(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _provider_handler(state: Provider) -> type[BaseHTTPRequestHandler]:
    import base64
    import hashlib
    import secrets as token_bytes
    from urllib.parse import parse_qs, urlencode, urlsplit

    class Handler(BaseHTTPRequestHandler):
        def _json(self, status: int, body: dict[str, Any]) -> None:
            raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Access-Control-Allow-Origin", "*")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            query = {k: v[0] for k, v in parse_qs(parts.query).items()}
            if parts.path == "/.well-known/openid-configuration":
                self._json(200, {"issuer": state.issuer, "authorization_endpoint": f"{state.issuer}/authorize",
                                 "token_endpoint": f"{state.issuer}/token"})
                return
            ok = (parts.path == "/authorize" and query.get("client_id") == state.client_id
                  and query.get("response_type") == "code" and query.get("code_challenge_method") == "S256")
            if not ok:
                self._json(400, {"error": "invalid_request"})
                return
            code = token_bytes.token_urlsafe(16)
            state.challenges[code] = (query["code_challenge"], query["redirect_uri"])
            self.send_response(302)
            back = urlencode({"code": code, "state": query["state"]})
            self.send_header("Location", f"{query['redirect_uri']}?{back}")
            self.end_headers()

        def do_POST(self) -> None:
            form = {k: v[0] for k, v in parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode()).items()}
            challenge, redirect = state.challenges.pop(form.get("code", ""), ("", ""))
            digest = hashlib.sha256(form.get("code_verifier", "").encode()).digest()
            proof = base64.urlsafe_b64encode(digest).decode().rstrip("=")
            if (form.get("grant_type") != "authorization_code" or form.get("client_id") != state.client_id
                    or not challenge or proof != challenge or form.get("redirect_uri") != redirect):
                self._json(400, {"error": "invalid_grant"})
                return
            state.exchanged.append(form["code"])
            self._json(200, {"access_token": state.access_token, "token_type": "Bearer", "expires_in": 3600})

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@pytest.fixture
def provider() -> Iterator[Provider]:
    state = Provider()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _provider_handler(state))
    state.port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
