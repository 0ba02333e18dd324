"""Resolve an agent's ``api_key_secret`` reference to the secret itself, at call time.

A reference is ``env:NAME`` (the environment variable ``NAME``) or a Secrets Manager ARN
(``arn:aws:secretsmanager:<region>:<account>:secret:<name>``). An ARN's ``SecretString`` is used as
is, unless it is a JSON object with an ``api_key`` field, which is then used (the shape the console's
key/value editor produces). Values from Secrets Manager are cached per container for ``CACHE_SECONDS``
so a busy worker does not call the service on every run, yet a rotation is seen within minutes; the
client is built once per region (the ARN's).

Guarantees: secrets live only in memory, are never logged and never appear in an error message (which
names the reference, not the value). Every failure is ``ExecutorError("secret_unavailable")``;
retry-safe when the service itself failed (throttling, unreachable), not when the reference is wrong.
This module must not store secrets in rows, events or files.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from kairos.executors.base import ExecutorError
from kairos.observability import logger

CACHE_SECONDS = 300.0
# Codes that say the reference or its permissions are wrong: retrying cannot help.
_PERMANENT = frozenset(
    {"ResourceNotFoundException", "AccessDeniedException", "InvalidRequestException",
     "InvalidParameterException", "DecryptionFailure", "ValidationException"}
)

_lock = threading.Lock()
_cache: dict[str, tuple[str, float]] = {}
_clients: dict[str, Any] = {}


def resolve(reference: str, *, env: dict[str, str] | None = None,
            clock: Callable[[], float] = time.monotonic) -> str:
    """The secret ``reference`` names, or ``ExecutorError("secret_unavailable")``."""
    if reference.startswith("env:"):
        name = reference[4:]
        value = (os.environ if env is None else env).get(name)
        if not name or not value:
            raise ExecutorError("secret_unavailable", f"environment variable {name!r} is not set")
        return value
    parts = reference.split(":")
    if len(parts) >= 7 and parts[0] == "arn" and parts[1].startswith("aws") and parts[2] == "secretsmanager":
        return _from_secrets_manager(reference, clock)
    raise ExecutorError(
        "secret_unavailable",
        "api_key_secret must be 'env:NAME' or a Secrets Manager ARN (arn:aws:secretsmanager:…)",
    )


def clear_cache() -> None:
    """Forget cached values and clients (tests; a container never needs it)."""
    with _lock:
        _cache.clear()
        _clients.clear()


def _from_secrets_manager(arn: str, clock: Callable[[], float]) -> str:
    now = clock()
    with _lock:
        hit = _cache.get(arn)
    if hit is not None and now - hit[1] < CACHE_SECONDS:
        return hit[0]
    value = _fetch(arn)
    with _lock:
        _cache[arn] = (value, now)
    return value


def _fetch(arn: str) -> str:
    from botocore.exceptions import BotoCoreError, ClientError  # with boto3, shipped by the Lambda runtime

    try:
        answer = _client(arn.split(":")[3]).get_secret_value(SecretId=arn)
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        logger.warning("secret unavailable", extra={"action": "secret.unavailable", "secret_arn": arn, "code": code})
        raise ExecutorError("secret_unavailable", f"secret {arn} could not be read ({code or 'error'})",
                            retry_safe=code not in _PERMANENT) from exc
    except BotoCoreError as exc:
        logger.warning("secret unavailable",
                       extra={"action": "secret.unavailable", "secret_arn": arn, "code": type(exc).__name__})
        raise ExecutorError("secret_unavailable", f"secret {arn} could not be read ({type(exc).__name__})",
                            retry_safe=True) from exc
    text = answer.get("SecretString")
    if text is None and answer.get("SecretBinary") is not None:
        try:
            text = bytes(answer["SecretBinary"]).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ExecutorError("secret_unavailable", f"secret {arn} is binary, not text") from exc
    if not text:
        raise ExecutorError("secret_unavailable", f"secret {arn} is empty")
    return _api_key(text)


def _api_key(text: str) -> str:
    if text.lstrip().startswith("{"):
        try:
            parsed = json.loads(text)
        except ValueError:
            return text
        if isinstance(parsed, dict) and isinstance(parsed.get("api_key"), str) and parsed["api_key"]:
            return str(parsed["api_key"])
    return text


def _client(region: str) -> Any:
    with _lock:
        client = _clients.get(region)
        if client is None:
            import boto3

            client = boto3.client("secretsmanager", region_name=region or None)
            _clients[region] = client
        return client
