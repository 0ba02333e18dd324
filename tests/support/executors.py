"""Executors for run tests: ``ScriptedExecutor`` (no network) and a local OpenAI-compatible server."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from kairos.executors.base import ExecutionRequest, PreparedCall, Reply, canonical_json, digest
from kairos.settings import Settings
from tests.support.streaming import chunks, event


class ScriptedExecutor:
    """A stand-in executor: records each prepared request and each send; ``on_send`` scripts the reply."""

    name = "scripted"

    def __init__(self, *, mutation: bool = False,
                 on_send: Callable[[PreparedCall, float], Reply] | None = None,
                 on_prepare: Callable[[ExecutionRequest], None] | None = None) -> None:
        self.mutation = mutation
        self.on_send = on_send
        self.on_prepare = on_prepare
        self.requests: list[ExecutionRequest] = []
        self.timeouts: list[float] = []

    def prepare(self, request: ExecutionRequest) -> PreparedCall:
        self.requests.append(request)
        if self.on_prepare is not None:
            self.on_prepare(request)
        body = canonical_json({"prompt": request.prompt, "n": len(request.transcript)})
        return PreparedCall(kind="http_call" if self.mutation else "model_call", mutation=self.mutation,
                            method="POST", url="http://target.test/", body=body, digest=digest(body))

    def send(self, prepared: PreparedCall, *, timeout: float) -> Reply:
        self.timeouts.append(timeout)
        if self.on_send is not None:
            return self.on_send(prepared, timeout)
        return Reply(content="the answer", usage={"prompt_tokens": 3, "completion_tokens": 5})

    def factory(self, name: str, *, settings: Settings) -> ScriptedExecutor:
        return self


def raising(error: Exception) -> Callable[[PreparedCall, float], Reply]:
    """An ``on_send`` that raises ``error``."""
    def send(prepared: PreparedCall, timeout: float) -> Reply:
        raise error

    return send


OPENAI_KEY = "sk-e2e-not-a-real-key"
OPENAI_SETTINGS = Settings(egress_allow=("127.0.0.1",))


@dataclass
class FakeOpenAI:
    port: int = 0
    requests: list[dict[str, Any]] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)  # answered first, then 200s
    # Assistant messages answered in order by the 200s (a tool loop's turns), then the default answer;
    # an entry {"raw": bytes} is answered as that exact body (what json.dumps cannot write: NaN, 1e999).
    script: list[dict[str, Any]] = field(default_factory=list)
    # The usage every 200 answers with (the provider's counts).
    usage: dict[str, int] = field(default_factory=lambda: {"prompt_tokens": 21, "completion_tokens": 7,
                                                           "total_tokens": 28})
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Answer a request that asks for a stream as server-sent events (tests.support.streaming), as OpenAI does.
    streams: bool = False

    def bodies(self) -> list[dict[str, Any]]:
        """Every request's JSON body, in order."""
        with self.lock:
            return [json.loads(r["raw"]) for r in self.requests]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


@pytest.fixture
def fake_openai(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOpenAI]:
    """A local OpenAI-compatible server answering chat completions (``statuses`` first, then 200s)."""
    monkeypatch.setenv("KAIROS_E2E_OPENAI_KEY", OPENAI_KEY)
    state = FakeOpenAI()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with state.lock:
                state.requests.append({"path": self.path, "headers": dict(self.headers.items()), "raw": raw})
                status = state.statuses.pop(0) if state.statuses else 200
                scripted = state.script.pop(0) if status == 200 and state.script else None
            if status == 200:
                message = {"role": "assistant", "content": "Good morning from the fake model."}
                if scripted is not None:
                    message = {"role": "assistant", "content": None, **scripted}
                body = scripted["raw"] if scripted is not None and "raw" in scripted else json.dumps({
                    "id": "chatcmpl-e2e", "object": "chat.completion",
                    "choices": [{"index": 0, "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
                                 "message": message}],
                    "usage": state.usage,
                }).encode()
            else:
                body = json.dumps({"error": {"type": "server_error", "message": "try later"}}).encode()
            if status == 200 and state.streams and json.loads(raw).get("stream") is True and (
                    scripted is None or "raw" not in scripted):
                self._stream(message)
                return
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _stream(self, message: dict[str, Any]) -> None:
            calls = [{"index": i, "id": c["id"], "type": "function", "function": c["function"]}
                     for i, c in enumerate(message.get("tool_calls") or ())]
            pieces = re.findall(r"\S+\s*|\s+", message.get("content") or "")  # a word a chunk
            frames = [event(c) for c in chunks(pieces, usage=state.usage, tool_calls=calls,
                                               finish_reason="tool_calls" if calls else "stop")]
            payload = b"".join(frames) + b"data: [DONE]\n\n"
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.port = server.server_address[1]
    # The shared key may travel in clear text to this server's port only (an entry names both).
    monkeypatch.setenv("KAIROS_SHARED_SECRETS", f"env:KAIROS_E2E_OPENAI_KEY@http://127.0.0.1:{state.port}")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


def openai_agent(fake: FakeOpenAI) -> dict[str, Any]:
    """An ``openai`` agent pointed at ``fake``, its key a shared ``env:`` secret."""
    return {"executor": "openai", "model": "gpt-e2e", "system": "You are terse.", "base_url": fake.base_url,
            "api_key_secret": "env:KAIROS_E2E_OPENAI_KEY", "max_tokens": 64}


def tool_call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """A scripted assistant message asking for one tool call, in the chat-completions format."""
    return {"tool_calls": [{"id": call_id, "type": "function",
                            "function": {"name": name, "arguments": json.dumps(arguments)}}]}
