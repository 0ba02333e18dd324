"""The ``Custom::KairosMigrations`` resource: applies the schema at deploy time.

``functions/migrate/app.py`` is the Lambda entry point and only calls ``handle``; the logic lives
here, in the layer, beside the migrations it applies.

CloudFormation sends Create, Update and Delete requests. Create and Update run
``kairos.migrations.apply`` against the database named by the deployed settings (``DATABASE_URL``,
else the ``DATABASE_SECRET_ARN`` secret, through ``DATABASE_PROXY_HOST`` when set); the migrator is
idempotent and serializes concurrent runners under an advisory lock, so re-running it on every layer
change is safe. Delete does nothing: removing the stack never drops a table.

Guarantees: CloudFormation always gets exactly one answer, a PUT of the cfn-response JSON to
``event["ResponseURL"]`` — SUCCESS, or FAILED with a short reason that names the error class and
never carries a password, a URL or a traceback. If the migration is still running shortly before the
Lambda timeout (e.g. waiting for another deploy's lock), the handler answers FAILED then rather than
leave the stack waiting. The physical id is stable across updates, so CloudFormation never sees a
replacement.

Must not: log the event (its ResponseURL is a presigned credential), run migrations on anything but
Create/Update, or depend on packages outside the layer (the answer uses ``urllib``).
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from typing import Any
from urllib.parse import unquote, urlsplit

from kairos import migrations, runtime
from kairos.observability import logger

PHYSICAL_ID = "kairos-schema"
# Answer FAILED this many seconds before the Lambda timeout if the migration has not finished.
TIMEOUT_MARGIN_SECONDS = 10.0
# The answer is retried: a lost PUT would leave CloudFormation waiting until ServiceTimeout.
RESPONSE_ATTEMPTS = 3
RESPONSE_BACKOFF_SECONDS = 1.0
RESPONSE_TIMEOUT_SECONDS = 30.0
MAX_REASON_CHARS = 512

_USERINFO = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)[^/@\s]*@", re.IGNORECASE)
_PASSWORD_OPTION = re.compile(r"password\s*=\s*\S+", re.IGNORECASE)


class _Responder:
    """Sends the one answer CloudFormation waits for; later attempts to answer are ignored."""

    def __init__(self, event: dict[str, Any]) -> None:
        self._event = event
        self._lock = threading.Lock()
        self.sent: dict[str, Any] | None = None

    def send(self, status: str, *, reason: str = "", data: dict[str, str] | None = None) -> bool:
        with self._lock:
            if self.sent is not None:
                return False
            body = {
                "Status": status,
                "Reason": reason or status,
                "PhysicalResourceId": self._event.get("PhysicalResourceId") or PHYSICAL_ID,
                "StackId": self._event["StackId"],
                "RequestId": self._event["RequestId"],
                "LogicalResourceId": self._event["LogicalResourceId"],
                "NoEcho": False,
                "Data": data or {},
            }
            _put(self._event["ResponseURL"], json.dumps(body).encode("utf-8"))
            self.sent = body
            logger.info(
                "answered cloudformation",
                extra={"action": "migrate_answered", "status": status, "request_type": self._event.get("RequestType")},
            )
            return True


def _put(url: str, payload: bytes) -> None:
    if urlsplit(url).scheme not in ("https", "http"):
        raise ValueError("ResponseURL must be an http(s) URL")
    last: Exception | None = None
    for attempt in range(1, RESPONSE_ATTEMPTS + 1):
        # The presigned S3 URL is signed without a content type: send an empty one, as cfn-response does.
        request = urllib.request.Request(  # noqa: S310 (scheme checked above)
            url, data=payload, method="PUT", headers={"Content-Type": "", "Content-Length": str(len(payload))}
        )
        try:
            with urllib.request.urlopen(request, timeout=RESPONSE_TIMEOUT_SECONDS) as response:  # noqa: S310 (scheme checked above)
                response.read()
            return
        except OSError as exc:  # URLError and HTTPError are OSErrors
            last = exc
            logger.warning(
                "could not answer cloudformation",
                extra={"action": "migrate_answer_failed", "attempt": attempt, "error": type(exc).__name__},
            )
            if attempt < RESPONSE_ATTEMPTS:
                time.sleep(RESPONSE_BACKOFF_SECONDS * attempt)
    if last is None:  # unreachable: each attempt either returned or failed
        raise RuntimeError("cloudformation was never asked")
    raise last


def reason_for(exc: BaseException, url: str | None) -> str:
    """A short, secret-free description of ``exc`` for CloudFormation's event log."""
    if isinstance(exc, migrations.MigrationError):
        text = str(exc)
    else:
        first_line = (str(exc).strip().splitlines() or [""])[0]
        text = f"{type(exc).__name__}: {first_line}" if first_line else type(exc).__name__
    text = _scrub(text, url)
    return f"migrations failed: {text}"[:MAX_REASON_CHARS]


def _scrub(text: str, url: str | None) -> str:
    if url:
        secrets = {url}
        try:
            password = urlsplit(url).password
        except ValueError:
            password = None
        if password:
            secrets |= {password, unquote(password)}
        for secret in sorted(secrets, key=len, reverse=True):
            text = text.replace(secret, "***")
    text = _USERINFO.sub(r"\g<scheme>***@", text)
    return _PASSWORD_OPTION.sub("password=***", text)


def handle(event: dict[str, Any], context: Any) -> dict[str, Any] | None:
    """Answers one CloudFormation custom-resource request; returns the answer it sent."""
    responder = _Responder(event)
    request_type = event.get("RequestType")
    log = {"action": "migrate", "request_type": request_type, "logical_id": event.get("LogicalResourceId")}
    watchdog = _start_watchdog(responder, context)
    url: str | None = None
    try:
        if request_type == "Delete":
            logger.info("delete: schema left in place", extra=log)
            responder.send("SUCCESS", reason="schema left in place")
        elif request_type in ("Create", "Update"):
            url = runtime.settings().resolve_database_url()
            started = time.monotonic()
            applied = migrations.apply(url)
            known = migrations.discover()
            names = [f"{m.version:04d}_{m.name}" for m in applied]
            logger.info(
                "migrations applied",
                extra={**log, "applied": names, "duration_ms": round((time.monotonic() - started) * 1000)},
            )
            responder.send(
                "SUCCESS",
                reason=f"applied {len(applied)} migration(s)",
                data={
                    "Applied": ",".join(names),
                    "SchemaVersion": f"{known[-1].version:04d}" if known else "",
                },
            )
        else:
            responder.send("FAILED", reason=f"unsupported request type {str(request_type)[:40]!r}")
    except Exception as exc:  # noqa: BLE001 (every failure must be answered; logged below, secret-free)
        reason = reason_for(exc, url)
        logger.error("migrations failed", extra={**log, "reason": reason})
        try:
            responder.send("FAILED", reason=reason)
        except Exception:
            logger.exception("could not report the failure to cloudformation", extra=log)
            raise
    finally:
        if watchdog is not None:
            watchdog.cancel()
    return responder.sent


def _start_watchdog(responder: _Responder, context: Any) -> threading.Timer | None:
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    if remaining is None:
        return None
    delay = max(0.0, remaining() / 1000.0 - TIMEOUT_MARGIN_SECONDS)

    def expire() -> None:
        try:
            responder.send("FAILED", reason="migrations did not finish before the function timeout")
        except Exception:  # noqa: BLE001 (a timer thread has no caller to raise to)
            logger.exception("could not report the timeout to cloudformation", extra={"action": "migrate"})

    timer = threading.Timer(delay, expire)
    timer.daemon = True
    timer.start()
    return timer
