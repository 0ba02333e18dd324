"""SendMessageBatch through a botocore client's own parts, without its generic request pipeline.

Role: the handoff's send (``kairos.handoff``) costs the tick's process CPU on every chunk of 10 run ids,
and most of it was botocore's generic machinery, not the call: parameter validation, the shape-driven
serialiser and parser, endpoint-ruleset resolution and about twenty event emits per call
(``bench/sqs_send.py`` measures the two paths side by side). ``send_message_batch(client, queue_url,
entries)`` answers exactly what ``client.send_message_batch(QueueUrl=..., Entries=...)`` answers (the
parsed ``Successful`` / ``Failed``, or the same ``ClientError`` class and ``Error.Code``, or the same
transport exception), building the request itself from the client's pieces:

* the endpoint and signing scope the client's own endpoint ruleset resolves (once per client), so
  ``AWS_ENDPOINT_URL`` / ``endpoint_url`` overrides, FIPS and dual-stack settings hold;
* the client's credentials, frozen per call (a refreshable provider is re-read as botocore would);
* SQS's JSON protocol as the pinned botocore sends it (AWS JSON 1.0, ``X-Amz-Target:
  AmazonSQS.SendMessageBatch``, ``x-amzn-query-mode``), SigV4-signed here: the same headers signed, the
  same canonical request, path and host as ``botocore.auth`` derives them, the signing key derived
  once a day (botocore's ``SigV4Auth`` on an ``AWSRequest`` cost half the lean call's CPU again:
  ``bench/sqs_send.py`` measures both; tests hold the request equal to the one botocore builds);
* the client's HTTP session (its urllib3 pool, timeouts, proxies, TLS settings, and its mapping of
  transport errors to botocore's exceptions); once the pool holds an open connection, the request is
  written and a plain 200 read by ``kairos.http_wire`` on it (the same bytes urllib3 writes, every other
  answer read by http.client, the same exceptions): urllib3 and http.client were three quarters of the
  call's CPU after botocore's pipeline was gone;
* the client's retry policy, asked through its own ``needs-retry`` event on every answer that is not a
  200 (standard or legacy mode, max attempts, backoff, retry quota, exactly as configured), and its
  ``after-call`` event on the final answer (the retry quota's release, SQS's query-compatible error
  code); an error answer is parsed by botocore's JSON parser.

Guarantees:
* The lean path is used only for a client it recognises: a botocore ``BaseClient`` for ``sqs`` over the
  JSON protocol, signing SigV4 with credentials, not in adaptive retry mode, whose event handlers for
  this operation are exactly the stock ones (a ``botocore.stub.Stubber``, moto's in-process mock while it
  is on, or any other hook makes ``sender`` answer None, and the caller uses the client). Handlers registered later
  are noticed on the next call (the emitter's lookup cache is replaced on every registration).
* botocore floats within boto3's range (its private parts this module reads can move between releases):
  a client whose parts are not where this module looks for them is not recognised (the client's call).
* A forwarding proxy whose ``send_message_batch`` is the real client's bound method (``runtime.LazySqs``)
  is seen through.

Must not: change what goes on the queue (bodies and ids are the caller's); retry anything the client's
own retry policy would not; log anything.
"""

from __future__ import annotations

import hmac
import json
import os
import threading
import time
import types
import weakref
from hashlib import sha256
from typing import Any
from urllib.parse import quote, urlsplit

from kairos import http_wire

OPERATION = "SendMessageBatch"
TARGET = "AmazonSQS.SendMessageBatch"
CONTENT_TYPE = "application/x-amz-json-1.0"

# The handlers a stock botocore SQS client has on this operation's events (standard and legacy retry
# modes). Each is either replayed here (signing, recursion header, user agent, the retry handler and
# the after-call handlers, through the client's own events) or a no-op for SendMessageBatch (idempotency
# tokens, request-validation members, API-version headers, retry-info headers, signer choice).
STOCK_HANDLERS = frozenset({
    "botocore.handlers.generate_idempotent_uuid",
    "botocore.handlers._handle_request_validation_mode_member",
    "botocore.handlers.add_recursion_detection_header",
    "botocore.handlers.inject_api_version_header_if_needed",
    "botocore.signers.RequestSigner.handler",
    "botocore.retries.standard.MaxAttemptsSeeder.seed_max_attempts",
    "botocore.useragent.UserAgentString.rebuild_and_replace_user_agent_handler",
    "botocore.handlers.add_retry_headers",
    "botocore.handlers.set_operation_specific_signer",
    "botocore.handlers._set_auth_scheme_preference_signer",
    "botocore.retries.standard.RetryHandler.needs_retry",
    "botocore.retryhandler.RetryHandler",
    "botocore.handlers._handle_sqs_compatible_error",
    "botocore.retries.standard.RetryQuotaChecker.release_retry_quota",
})
# Handlers that only append to the User-Agent header (Powertools registers one on every botocore session
# it sees): applied once, to the user agent this module sends.
USER_AGENT_HANDLERS = frozenset({
    "aws_lambda_powertools.shared.user_agent._create_feature_function.<locals>.add_powertools_feature",
})
# Pass-through hooks that intercept only while switched on (moto's in-process mock registers one on every
# botocore client once moto is imported): checked on every call, the client makes the call while one is on.
SWITCHED_HANDLERS = frozenset({"moto.core.botocore_stubber.BotocoreStubber"})
EVENTS = ("provide-client-params", "before-parameter-build", "before-endpoint-resolution", "before-call",
          "request-created", "choose-signer", "before-sign", "before-send", "response-received",
          "before-parse", "needs-retry", "after-call", "after-call-error")

_lock = threading.Lock()
# client -> (the emitter's lookup cache when checked, the sender or None)
_senders: weakref.WeakKeyDictionary[Any, tuple[object, Sender | None]] = weakref.WeakKeyDictionary()


def send_message_batch(client: Any, queue_url: str, entries: list[dict[str, Any]]) -> dict[str, Any]:
    """``client.send_message_batch(QueueUrl=queue_url, Entries=entries)``, on the lean path when the
    client allows it."""
    lean = sender(client)
    if lean is None:
        return dict(client.send_message_batch(QueueUrl=queue_url, Entries=entries))
    return lean.send(queue_url, entries)


def sender(client: Any) -> Sender | None:
    """The lean sender for this client, or None when the client must make the call itself."""
    real = getattr(getattr(client, "send_message_batch", None), "__self__", None)
    if real is None:
        return None
    try:
        token = real.meta.events._emitter._lookup_cache
    except AttributeError:
        return None
    entry = _senders.get(real)
    if entry is None or entry[0] is not token:
        try:
            built = _build(real)
        except Exception:  # noqa: BLE001 - a botocore whose private parts moved: the client's own call
            built = None
        with _lock:
            try:
                _senders[real] = entry = (token, built)
            except TypeError:  # not weak-referenceable: not a botocore client
                return None
    built = entry[1]
    if built is not None and any(switch.enabled for switch in built.switches):
        return None
    return built


def _handler_name(handler: Any) -> str:
    function = getattr(handler, "__func__", handler)
    if isinstance(function, types.FunctionType):
        return f"{function.__module__}.{function.__qualname__}"
    return f"{type(handler).__module__}.{type(handler).__qualname__}"


def _is_a(value: Any, cls: type) -> bool:
    """``isinstance`` without narrowing: the client's parts used below are botocore's private ones."""
    return isinstance(value, cls)


def _build(client: Any) -> Sender | None:
    """A sender for a client this module recognises, else None."""
    from botocore.client import BaseClient

    if not _is_a(client, BaseClient):
        return None
    meta = client.meta
    model = meta.service_model
    if (model.service_name != "sqs" or model.protocol != "json" or model.metadata.get("targetPrefix") != "AmazonSQS"
            or model.metadata.get("jsonVersion") != "1.0"):
        return None
    # An instrumented client (X-Ray, OpenTelemetry) wraps ``_make_api_call``: it must see the call.
    if type(BaseClient.__dict__.get("_make_api_call")) is not types.FunctionType or \
            "_make_api_call" in type(client).__dict__:
        return None
    config = meta.config
    if (config.retries or {}).get("mode") == "adaptive" or config.auth_scheme_preference:
        return None
    signer = client._request_signer
    credentials = signer._credentials
    if credentials is None or signer._signature_version not in ("v4", "s3v4"):
        return None
    emitter = meta.events._emitter
    service_id = model.service_id.hyphenize()
    user_agent = types.SimpleNamespace(headers={"User-Agent": client._user_agent_creator.to_string()})
    switches = []
    for event in EVENTS:
        for handler in emitter._handlers.prefix_search(f"{event}.{service_id}.{OPERATION}"):
            name = _handler_name(handler)
            if name in USER_AGENT_HANDLERS and event == "request-created":
                handler(request=user_agent)
            elif name in SWITCHED_HANDLERS:
                switches.append(handler)
            elif name not in STOCK_HANDLERS:
                return None
    operation = model.operation_model(OPERATION)
    endpoint_url, headers, properties = client._resolve_endpoint_ruleset(operation, {"QueueUrl": "", "Entries": []},
                                                                         {})
    region, signing_name = signer._region_name, signer._signing_name
    for scheme in (properties or {}).get("authSchemes", [])[:1]:
        if scheme.get("name") != "sigv4":
            return None
        region = scheme.get("signingRegion", region)
        signing_name = scheme.get("signingName", signing_name)
    if headers or not endpoint_url or not region:
        return None
    return Sender(client, endpoint_url, region, signing_name, credentials, operation, service_id,
                  user_agent.headers["User-Agent"], tuple(switches))


class Sender:
    """SendMessageBatch for one recognised client (thread-safe: no state per call)."""

    def __init__(self, client: Any, endpoint_url: str, region: str, signing_name: str, credentials: Any,
                 operation: Any, service_id: str, user_agent: str, switches: tuple[Any, ...] = ()) -> None:
        from botocore.auth import SIGV4_TIMESTAMP, _host_from_url  # type: ignore[attr-defined]
        from botocore.awsrequest import AWSPreparedRequest, _urljoin  # type: ignore[attr-defined]
        from botocore.compat import get_current_datetime
        from botocore.endpoint import convert_to_response_dict
        from botocore.parsers import create_parser
        from botocore.utils import normalize_url_path

        self._client = weakref.proxy(client)  # the cache must not keep the client alive
        self._url = _urljoin(endpoint_url, "/", None)  # as botocore joins the operation's path "/"
        # The signed parts that never change: the canonical path and host, as botocore.auth derives them.
        self._path = quote(normalize_url_path(urlsplit(self._url).path), safe="/~")
        self._host = _host_from_url(self._url)
        self._now = get_current_datetime
        self._timestamp = SIGV4_TIMESTAMP
        self._prepared = AWSPreparedRequest
        self._key: tuple[str, str, bytes] = ("", "", b"")  # (secret, day, signing key): one HMAC chain a day
        # The canonical request's fixed parts around the date and the session token (the signed headers
        # in sorted order: content-type, host, x-amz-date, [x-amz-security-token], x-amz-target,
        # x-amzn-query-mode), for a call without and with a token.
        host = " ".join(self._host.split())
        self._canonical_head = f"POST\n{self._path}\n\ncontent-type:{CONTENT_TYPE}\nhost:{host}\n"
        self._canonical_tail: tuple[tuple[str, str], ...] = tuple(
            (f"x-amz-target:{TARGET}\nx-amzn-query-mode:true\n\n{names}\n", names)
            for names in ("content-type;host;x-amz-date;x-amz-target;x-amzn-query-mode",
                          "content-type;host;x-amz-date;x-amz-security-token;x-amz-target;x-amzn-query-mode"))
        self._region = region
        self._signing_name = signing_name
        self._credentials = credentials
        self._operation = operation
        self._session = client._endpoint.http_session
        self._events = client.meta.events
        self._config = client.meta.config
        self._needs_retry_event = f"needs-retry.{service_id}.{OPERATION}"
        self._after_call_event = f"after-call.{service_id}.{OPERATION}"
        self._user_agent = user_agent
        self.switches = switches
        self._errors = client.exceptions
        self._response_dict = convert_to_response_dict
        self._parser = create_parser("json")
        self._wire = http_wire.wire(self._session, self._url)

    def send(self, queue_url: str, entries: list[dict[str, Any]]) -> dict[str, Any]:
        body = json.dumps({"QueueUrl": queue_url, "Entries": entries}).encode()
        context: dict[str, Any] = {"client_region": self._region, "client_config": self._config}
        request_dict = {"url_path": "/", "method": "POST", "body": body, "context": context}
        attempts = 1
        while True:
            # Signed again for every attempt, as botocore signs each retry; a signing error (no
            # credentials) is raised as it is, never retried.
            http, parsed, error = self._attempt(self._signed(body))
            if http is not None and http.status_code == 200:
                break
            delay = self._retry_delay(attempts, http, parsed, error, request_dict)
            if delay is None:
                break
            if delay:
                time.sleep(delay)  # the client's backoff, as botocore's endpoint sleeps it
            attempts += 1
        if error is not None:
            raise error
        self._events.emit(self._after_call_event, http_response=http, parsed=parsed, model=self._operation,
                          context=context)
        if http.status_code >= 300:
            code = context.get("error_code_override") or parsed.get("Error", {}).get("Code")
            raise self._errors.from_code(code)(parsed, OPERATION)
        return parsed

    def _attempt(self, request: Any) -> tuple[Any, dict[str, Any], Exception | None]:
        """One HTTP exchange: (the response, its parsed body, None) or (None, {}, the transport error)."""
        try:
            # On a pooled connection already open, written and read here; else the session's send.
            http = None if self._wire is None else self._wire.exchange(request.headers, request.body)
            if http is None:
                http = self._session.send(request)
        except Exception as exc:  # noqa: BLE001 - botocore's own transport errors: the retry policy decides
            return None, {}, exc
        if http.status_code == 200:
            try:
                loaded = json.loads(http.content)
            except ValueError:
                loaded = None
            if isinstance(loaded, dict):
                return http, loaded, None
        return http, self._parse(http), None  # an error answer, or an odd 200: as botocore's parser reads it

    def _signed(self, body: bytes) -> Any:
        """The request, signed now with the credentials of now (a refreshing provider is re-read)."""
        headers: Any = self.headers(body, self._credentials.get_frozen_credentials(),
                                    self._now().strftime(self._timestamp))
        return self._prepared("POST", self._url, headers, body, False)  # a dict: what urllib3 is given anyway

    def headers(self, body: bytes, credentials: Any, timestamp: str) -> dict[str, str]:
        """The request's headers, SigV4-signed at ``timestamp`` exactly as ``botocore.auth.SigV4Auth`` signs
        them (tests hold the two equal): the signed headers are the ones botocore signs for this call
        (the user agent and trace header are never signed), and the payload's SHA-256 is signed."""
        day = timestamp[:8]
        secret = credentials.secret_key
        cached_secret, cached_day, key = self._key
        if cached_secret != secret or cached_day != day:
            key = hmac.new(f"AWS4{secret}".encode(), day.encode(), sha256).digest()
            for part in (self._region, self._signing_name, "aws4_request"):
                key = hmac.new(key, part.encode(), sha256).digest()
            self._key = (secret, day, key)
        token = credentials.token
        token_line = f"x-amz-security-token:{' '.join(token.split())}\n" if token else ""
        tail, signed_names = self._canonical_tail[bool(token)]
        canonical = f"{self._canonical_head}x-amz-date:{timestamp}\n{token_line}{tail}{sha256(body).hexdigest()}"
        scope = f"{day}/{self._region}/{self._signing_name}/aws4_request"
        to_sign = f"AWS4-HMAC-SHA256\n{timestamp}\n{scope}\n{sha256(canonical.encode()).hexdigest()}"
        signature = hmac.digest(key, to_sign.encode(), "sha256").hex()
        headers = {"X-Amz-Target": TARGET, "Content-Type": CONTENT_TYPE, "x-amzn-query-mode": "true",
                   "User-Agent": self._user_agent, "X-Amz-Date": timestamp}
        if token:
            headers["X-Amz-Security-Token"] = token
        trace = os.environ.get("_X_AMZN_TRACE_ID")
        if trace and "AWS_LAMBDA_FUNCTION_NAME" in os.environ:  # botocore's recursion-detection header
            headers["X-Amzn-Trace-Id"] = quote(trace, safe="-=;:+&[]{}\"',")
        headers["Authorization"] = (f"AWS4-HMAC-SHA256 Credential={credentials.access_key}/{scope}, "
                                    f"SignedHeaders={signed_names}, Signature={signature}")
        headers["Content-Length"] = str(len(body))
        return headers

    def _parse(self, http: Any) -> dict[str, Any]:
        return dict(self._parser.parse(self._response_dict(http, self._operation), self._operation.output_shape))

    def _retry_delay(self, attempts: int, http: Any, parsed: dict[str, Any] | None, error: Exception | None,
                     request_dict: dict[str, Any]) -> float | None:
        """The client's retry handler's answer (seconds to wait), None for no retry."""
        from botocore.hooks import first_non_none_response

        responses = self._events.emit(self._needs_retry_event, response=None if http is None else (http, parsed),
                                      endpoint=self._client._endpoint, operation=self._operation, attempts=attempts,
                                      caught_exception=error, request_dict=request_dict)
        delay = first_non_none_response(responses)
        return None if delay is None else float(delay)
