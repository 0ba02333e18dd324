"""The ``bedrock`` executor: one Bedrock Converse call through boto3, with the function's IAM role.

``prepare`` builds the Converse request ``{"modelId", "messages", "system", "inferenceConfig":
{"maxTokens"}}``; its canonical JSON is both the effect's digest and, parsed back, exactly the
arguments ``send`` passes to ``converse`` (so the digest covers what is sent). Transcript entries keep
their role (``system`` entries join the system prompt, ``tool`` entries are sent as user text);
consecutive entries of one role are merged into one message, as Converse wants turns to alternate.
The user turn is the prompt plus the webhook payload block, as for ``openai``. In a tool loop the
request carries ``toolConfig`` and the earlier turns as ``toolUse`` / ``toolResult`` blocks, and a reply
may ask for tools (``toolUse`` blocks, ``stopReason: tool_use``) instead of answering. ``maxTokens`` is
``min(agent.max_tokens or 1024, 8192)``. When the worker follows the answer (``PreparedCall.on_text``,
as it does for every model step unless the agent says ``"stream": false``) the same arguments go to
``converse_stream`` (ConverseStream; the role's ``bedrock:InvokeModelWithResponseStream``): its events
add up to the Converse response (``_streamed``), told to ``on_text`` as the text grows, and an error
event is classified as the same error answered whole. A stream that ends without ``messageStop`` is
``peer_error`` with an unknown outcome; an event that cannot be read is ``malformed_reply``. The
endpoint is the AWS one of the function's region:
``base_url`` is refused (the call is signed with the role's credentials and must not go elsewhere) and
``api_key_secret`` is not used. Tests pass a client (e.g. one with a botocore ``Stubber``); otherwise a
client is built once per container and per timeout, with botocore's retries off (one attempt = one
effect).

| outcome | reason_code | retry_safe | outcome_unknown |
|---|---|---|---|
| EndpointConnectionError, connect timeout, TLS/proxy failure | connect_failed | yes | no |
| read timeout, ModelTimeoutException | timeout | no | yes |
| connection closed mid-call | peer_error | no | yes |
| ThrottlingException, ServiceQuotaExceededException | rate_limited | yes | no |
| InternalServerException, ServiceUnavailableException, ModelNotReadyException, other 5xx | peer_error | yes | no |
| ValidationException, ResourceNotFoundException, AccessDeniedException, bad parameters | agent_invalid | no | no |
| ModelErrorException, other errors | peer_error | no | no |
| no credentials | secret_unavailable | no | no |
| no text in the reply | malformed_reply | no | no |
| a reply the database cannot store (``kairos.executors.base.storable``) | unstorable_reply | no | no |

Content over 65,536 characters is cut and marked ``truncated`` (see ``openai``); ``truncated`` is also
set when the model stopped at ``maxTokens``. Usage is reported as ``prompt_tokens``,
``completion_tokens`` and ``total_tokens`` (from ``inputTokens``/``outputTokens``/``totalTokens``), the
same keys as the ``openai`` executor.
"""

from __future__ import annotations

import json
import os
import threading
from typing import TYPE_CHECKING, Any

from kairos.executors.base import (
    CONTENT_CHAR_LIMIT,
    ExecutionRequest,
    ExecutorError,
    ModelTurn,
    PreparedCall,
    Reply,
    TextProgress,
    ToolCall,
    agent_text,
    bounded_content,
    canonical_json,
    checked_tool_calls,
    digest,
    max_tokens,
    storable,
    user_content,
)

if TYPE_CHECKING:
    from mypy_boto3_bedrock_runtime import BedrockRuntimeClient

_RATE_LIMITED = frozenset({"ThrottlingException", "ServiceQuotaExceededException", "TooManyRequestsException"})
_TRANSIENT = frozenset({"InternalServerException", "ServiceUnavailableException", "ModelNotReadyException"})
_AGENT_INVALID = frozenset({"ValidationException", "ResourceNotFoundException", "AccessDeniedException"})
_USAGE_KEYS = {"inputTokens": "prompt_tokens", "outputTokens": "completion_tokens", "totalTokens": "total_tokens"}

_lock = threading.Lock()
_clients: dict[float | None, BedrockRuntimeClient] = {}


def default_client(timeout: float | None = None) -> BedrockRuntimeClient:
    """The container's ``bedrock-runtime`` client for ``timeout`` seconds of reading (retries off)."""
    with _lock:
        client = _clients.get(timeout)
        if client is None:
            import boto3
            from botocore.config import Config

            config = Config(retries={"total_max_attempts": 1}, connect_timeout=10,
                            read_timeout=timeout if timeout is not None else 60)
            client = boto3.client("bedrock-runtime", config=config)
            _clients[timeout] = client
        return client


class BedrockExecutor:
    name = "bedrock"

    def __init__(self, client: BedrockRuntimeClient | None = None) -> None:
        self._client = client

    def prepare(self, request: ExecutionRequest) -> PreparedCall:
        agent = request.agent
        model = agent_text(agent, "model", required=True)
        system_prompt = agent_text(agent, "system", required=False)
        if agent.get("base_url"):
            raise ExecutorError("agent_invalid", "bedrock agents call the AWS endpoint of the region; remove base_url")
        system = [{"text": system_prompt}] if system_prompt else []
        turns: list[tuple[str, str]] = []
        for entry in request.transcript:
            if not entry.content:
                continue
            if entry.role == "system":
                system.append({"text": entry.content})
            else:
                turns.append(("assistant" if entry.role == "assistant" else "user", entry.content))
        turns.append(("user", user_content(request.prompt, request.payload)))
        messages: list[dict[str, Any]] = []
        for role, block in [*((r, {"text": t}) for r, t in turns), *_turn_blocks(request.turns)]:
            if messages and messages[-1]["role"] == role:
                messages[-1]["content"].append(block)
            else:
                messages.append({"role": role, "content": [block]})
        call: dict[str, Any] = {"modelId": model, "messages": messages,
                                "inferenceConfig": {"maxTokens": max_tokens(agent)}}
        if request.tools:
            call["toolConfig"] = {"tools": [{"toolSpec": {"name": t.name, "description": t.description,
                                                          "inputSchema": {"json": t.parameters}}}
                                            for t in request.tools]}
        if system:
            call["system"] = system
        body = canonical_json(call)
        endpoint = self._endpoint()
        return PreparedCall(kind="model_call", mutation=False, method="POST",
                            url=f"{endpoint}/model/{model}/converse", body=body, digest=digest(body))

    def send(self, prepared: PreparedCall, *, timeout: float) -> Reply:
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            ConnectionClosedError,
            NoCredentialsError,
            ParamValidationError,
            ReadTimeoutError,
        )
        from botocore.exceptions import ConnectionError as BotoConnectionError

        call = json.loads(prepared.body)
        client = self._client or default_client(timeout)
        try:
            if prepared.on_text is not None:  # the worker follows the answer: ConverseStream, same request
                return _reply(_streamed(client.converse_stream(**call)["stream"], prepared.on_text))
            response = client.converse(**call)
        except ClientError as exc:  # an error event of a stream is one too (botocore's EventStreamError)
            raise _client_error(exc.response) from exc
        except ReadTimeoutError as exc:
            raise ExecutorError("timeout", "Bedrock did not answer in time", outcome_unknown=True) from exc
        except BotoConnectionError as exc:  # endpoint unreachable, connect timeout, TLS or proxy failure
            raise ExecutorError("connect_failed", f"could not connect to Bedrock ({type(exc).__name__})",
                                retry_safe=True) from exc
        except ConnectionClosedError as exc:
            raise ExecutorError("peer_error", "the connection to Bedrock broke after sending",
                                outcome_unknown=True) from exc
        except NoCredentialsError as exc:
            raise ExecutorError("secret_unavailable", "no AWS credentials to call Bedrock with") from exc
        except ParamValidationError as exc:
            raise ExecutorError("agent_invalid", "the Bedrock request is invalid for this agent") from exc
        except BotoCoreError as exc:
            raise ExecutorError("peer_error", f"the Bedrock call failed ({type(exc).__name__})",
                                outcome_unknown=True) from exc
        return _reply(response)

    def _endpoint(self) -> str:
        if self._client is not None:
            return str(self._client.meta.endpoint_url)
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        if not region:
            try:
                return str(default_client().meta.endpoint_url)
            except Exception as exc:  # botocore's NoRegionError and kin: the deployment lacks a region
                raise ExecutorError("internal", "no AWS region is configured for Bedrock") from exc
        return f"https://bedrock-runtime.{region}.amazonaws.com"


def _client_error(response: Any) -> ExecutorError:
    error = response.get("Error", {}) if isinstance(response, dict) else {}
    code = str(error.get("Code", ""))
    code = code[:1].upper() + code[1:]  # a stream's error event names it in camel case (throttlingException)
    status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    if code in _RATE_LIMITED or status == 429:
        return ExecutorError("rate_limited", f"Bedrock is throttling ({code or status})", retry_safe=True)
    if code == "ModelTimeoutException":
        return ExecutorError("timeout", "the model did not finish in time (ModelTimeoutException)",
                             outcome_unknown=True)
    if code in _AGENT_INVALID:
        return ExecutorError("agent_invalid", f"Bedrock refused the agent's request ({code}); check model and access")
    if code in _TRANSIENT or status >= 500:
        return ExecutorError("peer_error", f"Bedrock failed ({code or status})", retry_safe=True)
    return ExecutorError("peer_error", f"Bedrock refused the request ({code or status})")


def _turn_blocks(turns: Any) -> list[tuple[str, dict[str, Any]]]:
    """A tool loop's earlier steps as Converse content blocks: the assistant's ``toolUse`` blocks (after
    its text, if any), then a user ``toolResult`` block per answered call (consecutive ones merge)."""
    blocks: list[tuple[str, dict[str, Any]]] = []
    for turn in turns:
        if isinstance(turn, ModelTurn):
            if turn.content:
                blocks.append(("assistant", {"text": turn.content}))
            blocks.extend(("assistant", {"toolUse": {"toolUseId": c.id, "name": c.name, "input": c.arguments}})
                          for c in turn.tool_calls)
        else:
            blocks.append(("user", {"toolResult": {"toolUseId": turn.call_id, "content": [{"text": turn.content}],
                                                   "status": "error" if turn.is_error else "success"}}))
    return blocks


def _tool_calls(blocks: Any) -> tuple[ToolCall, ...]:
    calls: list[ToolCall] = []
    for block in blocks:
        use = block.get("toolUse") if isinstance(block, dict) else None
        if use is None:
            continue
        if not isinstance(use, dict) or not isinstance(use.get("input"), dict) or not isinstance(
                use.get("toolUseId"), str) or not isinstance(use.get("name"), str):
            raise ExecutorError("malformed_reply", "Bedrock asked for a tool call that cannot be read")
        calls.append(ToolCall(use["toolUseId"][:128], use["name"][:64], dict(use["input"])))
    return checked_tool_calls(tuple(calls))


def _streamed(events: Any, on_text: TextProgress) -> dict[str, Any]:
    """A ConverseStream's events as the Converse response they add up to: text blocks joined (``on_text``
    told the text so far as it grows, up to the content bound), ``toolUse`` blocks with their input's
    JSON joined and parsed, the stop reason and the usage of its ``metadata`` event."""
    blocks: dict[int, dict[str, Any]] = {}
    text = ""
    response: dict[str, Any] = {}
    try:
        for event in events:
            if "contentBlockStart" in event:
                start = event["contentBlockStart"]
                use = start["start"].get("toolUse") or {}
                blocks[int(start["contentBlockIndex"])] = {"toolUseId": use.get("toolUseId"), "name": use.get("name"),
                                                           "input": ""}
            elif "contentBlockDelta" in event:
                delta = event["contentBlockDelta"]
                block = blocks.setdefault(int(delta["contentBlockIndex"]), {"text": ""})
                piece = delta["delta"]
                if isinstance(piece.get("text"), str) and "text" in block:
                    block["text"] += piece["text"]
                    if len(text) <= CONTENT_CHAR_LIMIT:
                        text += piece["text"]
                        on_text(text)
                elif isinstance(piece.get("toolUse"), dict) and "input" in block:
                    block["input"] += str(piece["toolUse"].get("input") or "")
            elif "messageStop" in event:
                response["stopReason"] = event["messageStop"].get("stopReason")
            elif "metadata" in event:
                response["usage"] = event["metadata"].get("usage") or {}
        content = [{"text": b["text"]} if "text" in b else {"toolUse": {
            "toolUseId": b["toolUseId"], "name": b["name"], "input": json.loads(b["input"] or "{}")}}
            for _, b in sorted(blocks.items())]
    except (KeyError, TypeError, AttributeError, ValueError, RecursionError) as exc:
        raise ExecutorError("malformed_reply", "Bedrock's streamed reply cannot be read") from exc
    if "stopReason" not in response:
        raise ExecutorError("peer_error", "Bedrock's stream ended before the answer finished", outcome_unknown=True)
    return {**response, "output": {"message": {"role": "assistant", "content": content}}}


def _reply(response: Any) -> Reply:
    try:
        blocks = response["output"]["message"]["content"]
        texts = [block["text"] for block in blocks if isinstance(block, dict) and isinstance(block.get("text"), str)]
    except (KeyError, TypeError) as exc:
        raise ExecutorError("malformed_reply", "Bedrock's reply has no message") from exc
    calls = _tool_calls(blocks)
    if not texts and not calls:
        raise ExecutorError("malformed_reply", "Bedrock's reply has no text content")
    text, cut = bounded_content("".join(texts))
    usage: dict[str, int] = {}
    raw_usage = response.get("usage") or {}
    for source, key in _USAGE_KEYS.items():
        value = raw_usage.get(source)
        if isinstance(value, int) and not isinstance(value, bool):
            usage[key] = value
    return storable(Reply(content=text, usage=usage, truncated=cut or response.get("stopReason") == "max_tokens",
                          tool_calls=calls))
