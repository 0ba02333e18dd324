"""Secret references: what an owner may name, where a key may travel, and the owners' own key store.

A reference is a capability (docs/api.md "Credentials"). Two forms exist, and each is checked against
the owner who wrote it and the audience the secret would reach:

* ``env:NAME`` names a key the operator shares. It is valid only when ``KAIROS_SHARED_SECRETS`` lists
  it with an audience, and then only for an agent whose ``base_url`` is that audience: scheme, host
  and port. ``env:NAME@host`` is ``https://host:443`` only, so a key never travels in clear text or to
  another port of its host unless the entry says so: ``@host:8443`` (https on that port),
  ``@http://host`` (port 80), ``@http://host:8080``, ``@https://host:8443``, and ``:*`` for any port
  (``@http://127.0.0.1:*``, a local model on a port chosen at start). Nothing else in the function's
  environment (``AWS_*``, ``DATABASE_*``, …) can be named: the list decides, never the environment,
  so a refusal says nothing about which variables exist.
* A Secrets Manager ARN is valid only when its secret name lies in the caller's own namespace,
  ``<KAIROS_SECRET_PREFIX>/<owner>/`` (``namespace``), has no empty, ``.`` or ``..`` segment, and is not
  the database secret (``DATABASE_SECRET_ARN``), whatever its name.

``check`` enforces this when a reference is written (the API answers 422 with field and rule
``secret_reference`` or ``secret_audience``); ``resolve`` enforces it again right before the call, so a
reference edited in the database after it was written still cannot reach the environment or another
owner's keys (``SecretUnavailable``, not retry-safe; the executors fail the call
``secret_unavailable``). A webhook signing secret has no
audience host: only the owner's own ARNs are valid there.

``store``, ``list_owned`` and ``delete`` keep an owner's keys in Secrets Manager (moto locally) under
their namespace, for ``PUT/GET/DELETE /v1/secrets``; values are written, never returned.

Values read from Secrets Manager are cached per container for ``CACHE_SECONDS`` (a rotation is seen
within minutes; ``store`` and ``delete`` forget the entry in their own process at once). An ARN's
``SecretString`` is used as is, unless it is a JSON object with an ``api_key`` field.

Guarantees: secrets live only in memory, are never logged and never appear in an error message or a
refusal (which names the reference or the rule, not the value). Must not: store secrets in rows,
events or files; read a variable of the environment that ``KAIROS_SHARED_SECRETS`` does not list.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, Literal
from urllib.parse import urlsplit

from kairos.errors import MAX_LENGTH, MIN_LENGTH, PATTERN, FieldError, NotFound, ServiceUnavailable, ValidationFailed
from kairos.instants import rfc3339
from kairos.observability import logger

CACHE_SECONDS = 300.0
DEFAULT_PREFIX = "kairos"
NAME_MAX = 128
VALUE_MAX_BYTES = 65_536  # Secrets Manager's own limit for a SecretString
LIST_MAX = 1_000

Rule = Literal["secret_reference", "secret_audience"]

# Codes that say the reference or its permissions are wrong: retrying cannot help.
_PERMANENT = frozenset(
    {"ResourceNotFoundException", "AccessDeniedException", "InvalidRequestException",
     "InvalidParameterException", "DecryptionFailure", "ValidationException"}
)
_ENV = re.compile(r"env:([A-Za-z_][A-Za-z0-9_]{0,127})")
_ARN = re.compile(r"arn:aws(?:-[a-z]+)*:secretsmanager:([a-z0-9-]+):(\d{12}):secret:([A-Za-z0-9/_+=.@-]{1,512})")
_SEGMENT = re.compile(r"[A-Za-z0-9_+=.@-]{1,128}")  # the characters Secrets Manager allows in a name, less "/"
_ARN_SUFFIX = re.compile(r"-[A-Za-z0-9]{6}$")  # the random suffix Secrets Manager appends to an ARN's name
HINT = ("give a reference (your own secret's ARN from PUT /v1/secrets/{name}, or a shared env:NAME), "
        "never the secret itself")

_lock = threading.Lock()
_cache: dict[str, tuple[str, float]] = {}
_clients: dict[str, Any] = {}


def is_reference(value: str) -> bool:
    """True for the two reference forms (``env:NAME``, a Secrets Manager ARN); anything else may be a
    literal secret. Whether the owner may use it is ``check``'s question."""
    return bool(_ENV.fullmatch(value) or _ARN.fullmatch(value))


class SecretUnavailable(Exception):
    """A reference that may not be used here, or whose value cannot be read. ``retry_safe`` only when
    Secrets Manager itself failed (throttling, unreachable); the message names the reference or the
    rule, never a value. The executors fail the call with reason ``secret_unavailable``."""

    reason_code = "secret_unavailable"

    def __init__(self, message: str, *, retry_safe: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.retry_safe = retry_safe


class Refused(Exception):
    """A reference the owner may not use for this audience; ``rule`` is the FieldError rule."""

    def __init__(self, rule: Rule, message: str) -> None:
        super().__init__(message)
        self.rule: Rule = rule
        self.message = message


@dataclass(frozen=True)
class Policy:
    """What ``KAIROS_SHARED_SECRETS``, ``KAIROS_SECRET_PREFIX`` and ``DATABASE_SECRET_ARN`` allow."""

    # (variable name, scheme, host in lower case, port or None for any): where each shared key may go
    shared: frozenset[tuple[str, str, str, int | None]] = frozenset()
    prefix: str = DEFAULT_PREFIX
    database_secret_arn: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Policy:
        env = os.environ if env is None else env
        return _policy(env.get("KAIROS_SHARED_SECRETS", ""), env.get("KAIROS_SECRET_PREFIX", ""),
                       env.get("DATABASE_SECRET_ARN") or None)


@lru_cache(maxsize=16)
def _policy(shared_list: str, prefix: str, database_secret_arn: str | None) -> Policy:
    """Parsed once per distinct setting (a container has one), so a bad entry is logged once."""
    shared: set[tuple[str, str, str, int | None]] = set()
    for entry in filter(None, (e.strip() for e in shared_list.split(","))):
        reference, at, audience = entry.partition("@")
        match = _ENV.fullmatch(reference)
        parsed = _shared_audience(audience) if at and match is not None else None
        if match is None or parsed is None:
            # An operator's typo: say so (the entry names a variable, never a value) and share nothing.
            logger.warning("KAIROS_SHARED_SECRETS entry ignored",
                           extra={"action": "secret_shared_entry_invalid", "entry": entry[:200]})
            continue
        shared.add((match.group(1), *parsed))
    return Policy(frozenset(shared), prefix.strip().strip("/") or DEFAULT_PREFIX, database_secret_arn)


_DEFAULT_PORTS = {"http": 80, "https": 443}


def _shared_audience(text: str) -> tuple[str, str, int | None] | None:
    """``[scheme://]host[:port|:*]`` as (scheme, host, port or None for any); https and its default
    port unless the entry names others; None when it is not that shape."""
    scheme, found, rest = text.partition("://")
    if not found:
        scheme, rest = "https", text
    scheme = scheme.lower()
    any_port = rest.endswith(":*")
    rest = rest[:-2] if any_port else rest
    if scheme not in _DEFAULT_PORTS or "@" in rest:
        return None
    try:
        parts = urlsplit(f"//{rest}")
        port = parts.port  # raises ValueError for a port that is not a number in range
    except ValueError:
        return None
    if not parts.hostname or parts.path or parts.query or parts.fragment or (any_port and port is not None):
        return None
    return scheme, parts.hostname.lower().rstrip("."), None if any_port else (port or _DEFAULT_PORTS[scheme])


def _shown(scheme: str, host: str, port: int | None) -> str:
    shown = f"[{host}]" if ":" in host else host
    if port is None:
        return f"{scheme}://{shown}:*"
    return f"{scheme}://{shown}" + ("" if port == _DEFAULT_PORTS[scheme] else f":{port}")


def namespace(owner: str, policy: Policy) -> str:
    """``<prefix>/<owner>/``: the names an owner's references may start with (``owner_segment``)."""
    if not owner:
        raise Refused("secret_reference", "no owner")
    return f"{policy.prefix}/{owner_segment(owner)}/"


def owner_segment(owner: str) -> str:
    """The one path segment that stands for ``owner`` in a namespace (secrets, corpus prefixes).

    An owner (a JWT ``sub``) that is not a plain name segment (``auth0|123``, ``a/b``, ``..``) is
    written as ``=`` and the SHA-256 of the owner: injective in practice, since plain segments never
    start with ``=``.
    """
    if not _SEGMENT.fullmatch(owner) or owner in (".", "..") or owner.startswith("="):
        return "=" + hashlib.sha256(owner.encode("utf-8")).hexdigest()[:40]
    return owner


def check(reference: str, *, owner: str, audience: str | None, policy: Policy | None = None) -> None:
    """Raises ``Refused`` unless ``owner`` may send the secret ``reference`` names to ``audience``.

    ``audience`` is the URL the secret would travel to or sign for (an agent's ``base_url``), or None
    where there is none (a webhook signing secret).
    """
    policy = Policy.from_env() if policy is None else policy
    env = _ENV.fullmatch(reference)
    if env is not None:
        _check_shared(env.group(1), reference, audience, policy)
        return
    arn = _ARN.fullmatch(reference)
    if arn is None:
        raise Refused("secret_reference", HINT)
    _check_owned(arn.group(3), owner, policy)


def _check_shared(name: str, reference: str, audience: str | None, policy: Policy) -> None:
    places = sorted((scheme, host, port) for shared, scheme, host, port in policy.shared if shared == name)
    if not places:
        raise Refused("secret_reference",
                      f"{reference} is not a key the operator shares; store your own key with "
                      "PUT /v1/secrets/{name} and give the reference it answers")
    target = _audience(audience)
    if target is None or not any(_reaches(place, target) for place in places):
        where = ("this use has no model host" if audience is None
                 else "base_url's scheme, host and port are not those")
        raise Refused("secret_audience",
                      f"{reference} may only be sent to {', '.join(_shown(*p) for p in places)}; {where}")


def _audience(audience: str | None) -> tuple[str, str, int] | None:
    """(scheme, host, port) of the URL a key would travel to."""
    if audience is None:
        return None
    try:
        parts = urlsplit(audience)
        scheme = parts.scheme.lower()
        port = parts.port or _DEFAULT_PORTS.get(scheme)
    except ValueError:
        return None
    if not parts.hostname or port is None:
        return None
    return scheme, parts.hostname.lower().rstrip("."), port


def _reaches(place: tuple[str, str, int | None], target: tuple[str, str, int]) -> bool:
    scheme, host, port = place
    return (scheme, host) == target[:2] and (port is None or port == target[2])


def _check_owned(name: str, owner: str, policy: Policy) -> None:
    mine = namespace(owner, policy)
    segments = name.split("/")
    if not name.startswith(mine) or any(s in ("", ".", "..") for s in segments):
        raise Refused("secret_reference",
                      f"a Secrets Manager reference must name one of your secrets, under {mine}; "
                      "store one with PUT /v1/secrets/{name}")
    if policy.database_secret_arn is not None and _same_secret(name, policy.database_secret_arn):
        raise Refused("secret_reference", "this secret cannot be referenced")


def _same_secret(name: str, database_arn: str) -> bool:
    """Whether ``name`` (full or partial, with or without the ARN's random suffix) is the database's."""
    match = _ARN.fullmatch(database_arn)
    other = match.group(3) if match else database_arn
    bare, other_bare = _ARN_SUFFIX.sub("", name), _ARN_SUFFIX.sub("", other)
    return name in (other, other_bare) or bare in (other, other_bare)


def field_error(error: Refused, field: str) -> FieldError:
    return FieldError(field, error.rule, error.message)


def resolve(reference: str, *, owner: str, audience: str | None, policy: Policy | None = None,
            env: Mapping[str, str] | None = None, clock: Callable[[], float] = time.monotonic) -> str:
    """The secret ``reference`` names, re-checked for ``owner`` and ``audience`` first.

    Every failure is ``SecretUnavailable``: not retry-safe for a refused or wrong
    reference, retry-safe when Secrets Manager itself failed (throttling, unreachable).
    """
    policy = Policy.from_env(env) if policy is None else policy
    try:
        check(reference, owner=owner, audience=audience, policy=policy)
    except Refused as refused:
        logger.warning("secret reference refused at the call",
                       extra={"action": "secret_refused", "rule": refused.rule})
        raise SecretUnavailable(f"api_key_secret refused ({refused.rule}): "
                            f"{refused.message}") from None
    env_match = _ENV.fullmatch(reference)
    if env_match is not None:
        value = (os.environ if env is None else env).get(env_match.group(1))
        if not value:
            raise SecretUnavailable(f"the shared key {reference} is not set on this function")
        return value
    return _from_secrets_manager(reference, clock)


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
        logger.warning("secret unavailable", extra={"action": "secret_unavailable", "secret_arn": arn, "code": code})
        raise SecretUnavailable(f"secret {arn} could not be read ({code or 'error'})",
                            retry_safe=code not in _PERMANENT) from exc
    except BotoCoreError as exc:
        logger.warning("secret unavailable",
                       extra={"action": "secret_unavailable", "secret_arn": arn, "code": type(exc).__name__})
        raise SecretUnavailable(f"secret {arn} could not be read ({type(exc).__name__})",
                            retry_safe=True) from exc
    text = answer.get("SecretString")
    if text is None and answer.get("SecretBinary") is not None:
        try:
            text = bytes(answer["SecretBinary"]).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SecretUnavailable(f"secret {arn} is binary, not text") from exc
    if not text:
        raise SecretUnavailable(f"secret {arn} is empty")
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


def _client(region: str | None) -> Any:
    key = region or ""
    with _lock:
        client = _clients.get(key)
        if client is None:
            import boto3

            client = boto3.client("secretsmanager", region_name=region or None)
            _clients[key] = client
        return client


# --- an owner's own keys (PUT/GET/DELETE /v1/secrets) ------------------------------------------------


@dataclass(frozen=True)
class StoredSecret:
    name: str  # as the owner named it, without the namespace
    reference: str  # the ARN to give as api_key_secret or signing.secret
    updated_at: datetime

    def as_json(self) -> dict[str, Any]:

        return {"name": self.name, "reference": self.reference, "updated_at": rfc3339(self.updated_at)}


def check_name(name: str) -> None:
    """``ValidationFailed`` (field ``name``) unless ``name`` is one segment Secrets Manager accepts."""
    if not _SEGMENT.fullmatch(name) or name in (".", ".."):
        raise ValidationFailed([FieldError("name", PATTERN, f"1 to {NAME_MAX} characters of A-Z a-z 0-9 _ + = . @ -"
                                           " (no slash, not . or ..)")])


def store(owner: str, name: str, value: str, *, policy: Policy | None = None) -> tuple[StoredSecret, bool]:
    """Creates or replaces the owner's secret ``name``; the record and whether it was created."""
    policy = Policy.from_env() if policy is None else policy
    check_name(name)
    if not value or len(value.encode("utf-8")) > VALUE_MAX_BYTES:
        rule = MIN_LENGTH if not value else MAX_LENGTH
        raise ValidationFailed([FieldError("value", rule, f"1 to {VALUE_MAX_BYTES} bytes (UTF-8)")])
    full = namespace(owner, policy) + name
    client = _client(None)
    created = True
    with _service("store"):
        try:
            answer = client.create_secret(Name=full, SecretString=value,
                                          Description="a Kairos owner's key (PUT /v1/secrets)")
        except client.exceptions.ResourceExistsException:
            created = False
            answer = client.put_secret_value(SecretId=full, SecretString=value)
        described = client.describe_secret(SecretId=answer["ARN"])
    _forget(answer["ARN"])
    logger.info("secret stored", extra={"action": "secret_stored", "new": created})
    return StoredSecret(name, answer["ARN"], _changed(described)), created


def list_owned(owner: str, *, policy: Policy | None = None) -> list[StoredSecret]:
    """The owner's secrets, by name (at most ``LIST_MAX``)."""
    policy = Policy.from_env() if policy is None else policy
    mine = namespace(owner, policy)
    client = _client(None)
    found: list[StoredSecret] = []
    token: str | None = None
    with _service("list"):
        while len(found) < LIST_MAX:
            page = client.list_secrets(Filters=[{"Key": "name", "Values": [mine]}], MaxResults=100,
                                       **({"NextToken": token} if token else {}))
            for entry in page.get("SecretList", []):
                rest = str(entry.get("Name", ""))[len(mine):]
                # The service's name filter matches prefixes word by word: keep exactly the namespace.
                if str(entry.get("Name", "")).startswith(mine) and _SEGMENT.fullmatch(rest):
                    found.append(StoredSecret(rest, entry["ARN"], _changed(entry)))
            token = page.get("NextToken")
            if not token:
                break
    return sorted(found, key=lambda s: s.name)[:LIST_MAX]


def delete(owner: str, name: str, *, policy: Policy | None = None) -> None:
    """Removes the owner's secret ``name`` at once (no recovery window: the name is free again)."""
    policy = Policy.from_env() if policy is None else policy
    check_name(name)
    client = _client(None)
    with _service("delete"):
        # Deleting without recovery answers success for a name that does not exist: look first, so a
        # missing (or another owner's) name is the same 404 as everywhere else.
        try:
            found = client.describe_secret(SecretId=namespace(owner, policy) + name)
        except client.exceptions.ResourceNotFoundException:
            raise NotFound("secret") from None
        if found.get("DeletedDate") is not None:
            raise NotFound("secret")
        client.delete_secret(SecretId=found["ARN"], ForceDeleteWithoutRecovery=True)
    _forget(found["ARN"])
    logger.info("secret deleted", extra={"action": "secret_deleted"})


def _changed(described: Mapping[str, Any]) -> datetime:
    stamp = described.get("LastChangedDate") or described.get("CreatedDate")
    return stamp.astimezone(UTC) if isinstance(stamp, datetime) else datetime.now(UTC)


def _forget(arn: str) -> None:
    with _lock:
        _cache.pop(arn, None)


@contextmanager
def _service(operation: str) -> Iterator[None]:
    """Secrets Manager failures as ``ServiceUnavailable`` (503), logged without names or values."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        yield
    except (ClientError, BotoCoreError) as error:
        code = (str(error.response.get("Error", {}).get("Code", "")) if isinstance(error, ClientError)
                else type(error).__name__)
        logger.warning("secret store failed", extra={"action": "secret_store_failed", "operation": operation,
                                                     "code": code})
        raise ServiceUnavailable("the secret store is unavailable; try again") from None
