"""The ``echo`` executor: answers ``echo: <prompt>`` without any network, for the local demo and tests.

It goes through the same two phases as the real executors (a prepared call with a canonical body and
digest, then ``send``), so the worker's effect ledger treats it like any model call. It must never
reach out of the process.
"""

from __future__ import annotations

import json

from kairos.executors.base import ExecutionRequest, ExecutorError, PreparedCall, Reply, canonical_json, digest


class EchoExecutor:
    name = "echo"

    def prepare(self, request: ExecutionRequest) -> PreparedCall:
        body = canonical_json({"prompt": request.prompt})
        return PreparedCall(kind="model_call", mutation=False, method="POST", url="echo:", body=body,
                            digest=digest(body))

    def send(self, prepared: PreparedCall, *, timeout: float) -> Reply:
        try:
            prompt = json.loads(prepared.body)["prompt"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ExecutorError("internal", "the echo call was not prepared by the echo executor") from exc
        return Reply(content=f"echo: {prompt}")
