"""Streamed chat completions for tests: the chunks an OpenAI-compatible server sends as server-sent
events (``chunks``), and a ``Peer`` behaviour that writes them (``sse``) — chunked, flushed event by
event, optionally holding the stream open at a gate until the test has seen what it waits for."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.support.peer import Behaviour, Peer


def chunk(delta: dict[str, Any] | None = None, *, finish_reason: str | None = None,
          usage: dict[str, int] | None = None, choices: bool = True) -> dict[str, Any]:
    """One ``chat.completion.chunk`` (a usage-only chunk has no choices, as OpenAI sends it)."""
    body: dict[str, Any] = {"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1, "model": "m",
                            "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish_reason}]
                            if choices else []}
    if usage is not None:
        body["usage"] = usage
    return body


USAGE = {"prompt_tokens": 11, "completion_tokens": 4, "total_tokens": 15}


def chunks(pieces: Sequence[str], *, usage: dict[str, int] | None = USAGE, finish_reason: str = "stop",
           tool_calls: Sequence[dict[str, Any]] = ()) -> list[dict[str, Any]]:
    """A whole streamed answer: the role, one chunk per text piece, tool-call deltas, the finish
    reason, then the usage in a chunk of its own (``stream_options.include_usage``)."""
    out = [chunk({"role": "assistant", "content": ""})]
    out += [chunk({"content": p}) for p in pieces]
    out += [chunk({"tool_calls": [t]}) for t in tool_calls]
    out.append(chunk({}, finish_reason=finish_reason))
    if usage is not None:
        out.append(chunk(usage=usage, choices=False))
    return out


def event(data: dict[str, Any] | str) -> bytes:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n".encode()


def sse(events: Sequence[dict[str, Any] | str | bytes], *, done: bool = True, gate_after: int | None = None,
        gate: threading.Event | None = None, gates: dict[int, threading.Event] | None = None,
        content_type: str = "text/event-stream") -> Behaviour:
    """Answers 200 with ``events`` as server-sent events (bytes are written as they are), then
    ``data: [DONE]``; with ``gate_after``, waits on ``gate`` after that many events (the stream stays
    open: the client has read them and waits for more); ``gates`` holds several such stops."""
    stops = dict(gates or {})
    if gate_after is not None and gate is not None:
        stops[gate_after] = gate

    def behaviour(handler: BaseHTTPRequestHandler, peer: Peer) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        frames = [e if isinstance(e, bytes) else event(e) for e in events]
        if done:
            frames.append(b"data: [DONE]\n\n")
        for i, frame in enumerate(frames):
            if i in stops:
                stops[i].wait(30)
            handler.wfile.write(b"%x\r\n%s\r\n" % (len(frame), frame))
            handler.wfile.flush()
        handler.wfile.write(b"0\r\n\r\n")
        handler.wfile.flush()

    return behaviour
