"""Settings read from the environment (the table in docs/operations.md "Configuration"), validated once.

``DATABASE_URL`` wins; otherwise ``DATABASE_SECRET_ARN`` names a Secrets Manager secret in the RDS
shape (``{"host", "port", "username", "password", "dbname"}``) that is read once per container.
``DATABASE_PROXY_HOST`` (an RDS Proxy endpoint) replaces the secret's host when set.

A frozen dataclass, not a pydantic model: every handler reads it on its cold path, and ``from_env``
already parses each variable into its type, so importing pydantic here would only add to every
cold start (the tick and the run function never need pydantic otherwise).

A value that cannot mean anything (``KAIROS_RETENTION_DAYS=thirty``, ``KAIROS_OWNER_CONCURRENCY=0``,
``KAIROS_MODEL_PRICES`` that is not an object of ``[input, output]`` prices per million tokens) is refused with
``SettingInvalid`` naming the variable and the rule, so a misconfigured function fails its cold start
loudly instead of running with a guess.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal
from urllib.parse import quote

DEFAULT_RETENTION_DAYS = 30
MAX_RETENTION_DAYS = 3650
# Per-owner budgets (docs/api.md "Budgets"; kairos.budgets).
DEFAULT_OWNER_CONCURRENCY = 4
MAX_OWNER_CONCURRENCY = 1000
DEFAULT_OWNER_QUEUE_MAX = 200
MAX_OWNER_QUEUE_MAX = 100_000
DEFAULT_OWNER_DAILY_TOKENS = 2_000_000
MAX_OWNER_DAILY_TOKENS = 10**12
DEFAULT_OWNER_DAILY_COST_USD = 50.0
MAX_OWNER_DAILY_COST_USD = 10**9
# Corpus runs (docs/api.md "Corpus runs"; kairos.corpus): partitions at once per run.
DEFAULT_CORPUS_MAX_CONCURRENCY = 1
MAX_CORPUS_MAX_CONCURRENCY = 16
# The server's caps on a schedule's or an agent's ``limits`` (docs/api.md "Limits"; kairos.limits): a
# request above a cap is refused (422 naming the field), and a run never gets more than the cap in force.
# Lambda's hard maximum is 900 s; a run stops well before it so it can still write its failure.
RUNTIME_CAP_SECONDS = 840
DEFAULT_MAX_RUNTIME_SECONDS = RUNTIME_CAP_SECONDS
DEFAULT_MAX_ATTEMPTS = 10
MAX_MAX_ATTEMPTS = 100
DEFAULT_MAX_STEPS = 64
MAX_MAX_STEPS = 256
DEFAULT_MAX_RATE_PER_MINUTE = 600
MAX_MAX_RATE_PER_MINUTE = 100_000
# Runs of one SQS batch executed at once by one invocation (kairos.execution.sqs): the model's wait
# is billed once for all of them. 10 is SQS's largest batch without a batching window.
DEFAULT_RUN_CONCURRENCY_PER_INVOCATION = 10
MAX_RUN_CONCURRENCY_PER_INVOCATION = 100


class SettingInvalid(ValueError):
    """An environment variable whose value breaks its rule; the message names both."""

    def __init__(self, name: str, rule: str, value: str) -> None:
        super().__init__(f"{name} {rule}, got {value!r}")
        self.name = name
        self.rule = rule


def _retention_days(raw: str | None) -> int:
    """``KAIROS_RETENTION_DAYS``: whole days from 1 to 3650; unset or empty means the default (30)."""
    text = (raw or "").strip()
    if not text:
        return DEFAULT_RETENTION_DAYS
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_RETENTION_DAYS:
        raise SettingInvalid("KAIROS_RETENTION_DAYS",
                             f"must be a whole number of days from 1 to {MAX_RETENTION_DAYS}", raw or "")
    return int(text)


def _whole(name: str, raw: str | None, default: int, low: int, high: int, unit: str) -> int:
    """A whole number from ``low`` to ``high``; unset or empty means ``default``."""
    text = (raw or "").strip()
    if not text:
        return default
    if not (text.isascii() and text.isdigit()) or not low <= int(text) <= high:
        raise SettingInvalid(name, f"must be a whole number of {unit} from {low} to {high}", raw or "")
    return int(text)


def _usd(name: str, raw: str | None, default: float, high: float) -> float:
    """An amount of US dollars above 0 and at most ``high``; unset or empty means ``default``."""
    text = (raw or "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= high):
        raise SettingInvalid(name, f"must be an amount of US dollars above 0 and at most {high:g}", raw or "")
    return value


def _model_prices(raw: str | None) -> dict[str, tuple[float, float]]:
    """``KAIROS_MODEL_PRICES``: a JSON object ``{"model": [usd_per_M_input, usd_per_M_output]}`` (the
    key ``"*"`` prices every model not named); unset or empty means no prices (cost 0)."""
    text = (raw or "").strip()
    if not text:
        return {}
    rule = 'must be a JSON object {"model": [usd_per_million_input, usd_per_million_output]} of amounts >= 0'
    try:
        data = json.loads(text)
    except ValueError:
        raise SettingInvalid("KAIROS_MODEL_PRICES", rule, raw or "") from None
    if not isinstance(data, dict):
        raise SettingInvalid("KAIROS_MODEL_PRICES", rule, raw or "")
    prices: dict[str, tuple[float, float]] = {}
    for model, pair in data.items():
        ok = (isinstance(model, str) and model and isinstance(pair, list) and len(pair) == 2
              and all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
                      for v in pair))
        if not ok:
            raise SettingInvalid("KAIROS_MODEL_PRICES", rule, raw or "")
        prices[model] = (float(pair[0]), float(pair[1]))
    return prices


def _set(raw: str | None) -> str | None:
    """The value as given; unset or empty means None."""
    return raw or None


def _trimmed(raw: str | None) -> str | None:
    """The value without surrounding spaces; unset or blank means None."""
    return (raw or "").strip() or None


def _names(raw: str | None) -> tuple[str, ...]:
    """A comma-separated list, each name trimmed, empty ones dropped."""
    return tuple(name.strip() for name in (raw or "").split(",") if name.strip())


def _on(raw: str | None) -> bool:
    """A switch that is on unless ``off``, ``false`` or ``0``; unset means on."""
    return (raw or "on").strip().lower() not in ("off", "false", "0")


def _auth(raw: str | None) -> Literal["jwt", "dev"]:
    """``KAIROS_AUTH``: ``dev`` (the tokens of ``KAIROS_DEV_TOKENS``) or, for anything else, ``jwt``."""
    return "dev" if raw == "dev" else "jwt"


def _dev_tokens(raw: str | None) -> dict[str, str]:
    """``KAIROS_DEV_TOKENS``: ``token=principal`` pairs, comma-separated; a pair missing either is skipped."""
    tokens: dict[str, str] = {}
    for pair in filter(None, (p.strip() for p in (raw or "").split(","))):
        token, _, principal = pair.partition("=")
        if token and principal:
            tokens[token.strip()] = principal.strip()
    return tokens


def _public_url(raw: str | None) -> str | None:
    return (raw or "").rstrip("/") or None


def _issuer(raw: str | None) -> str | None:
    return (raw or "").strip().rstrip("/") or None


def _scopes(raw: str | None) -> str:
    """``KAIROS_CONSOLE_SCOPES``: scopes separated by spaces or commas, one space each; none means ``openid``."""
    return " ".join((raw or "openid").replace(",", " ").split()) or "openid"


def _whole_of(name: str, default: int, high: int, unit: str) -> Callable[[str | None], int]:
    return lambda raw: _whole(name, raw, default, 1, high, unit)


def _usd_of(name: str, default: float, high: float) -> Callable[[str | None], float]:
    return lambda raw: _usd(name, raw, default, high)


@dataclass(frozen=True)
class Settings:
    database_url: str | None = None
    database_secret_arn: str | None = None
    run_queue_url: str | None = None
    database_proxy_host: str | None = None
    auth: Literal["jwt", "dev"] = "jwt"
    dev_tokens: dict[str, str] = field(default_factory=dict)
    public_url: str | None = None  # None: the API answers with the host the request came to
    egress_allow: tuple[str, ...] = ()
    # The worker's hot statements run prepared (kairos.db) unless KAIROS_PREPARED_STATEMENTS=off or
    # the database is reached through RDS Proxy, which pins every session that prepares.
    prepared_statements: bool = True
    # The worker batches a transaction's statements in pipeline mode (kairos.db) unless KAIROS_PIPELINE=off.
    pipeline: bool = True
    # How long run threads and webhook payloads of ended runs are kept (kairos.tick.prune).
    retention_days: int = DEFAULT_RETENTION_DAYS
    # Per-owner budgets (kairos.budgets): running slots, queued runs, daily tokens and cost, prices.
    owner_concurrency: int = DEFAULT_OWNER_CONCURRENCY
    owner_queue_max: int = DEFAULT_OWNER_QUEUE_MAX
    owner_daily_tokens: int = DEFAULT_OWNER_DAILY_TOKENS
    owner_daily_cost_usd: float = DEFAULT_OWNER_DAILY_COST_USD
    model_prices: dict[str, tuple[float, float]] = field(default_factory=dict)
    # Corpus runs (kairos.corpus): the buckets a corpus may read, the bucket exports go to, partitions at once.
    corpus_buckets: tuple[str, ...] = ()
    export_bucket: str | None = None
    corpus_max_concurrency: int = DEFAULT_CORPUS_MAX_CONCURRENCY
    # The caps on ``limits`` (kairos.limits): runtime, attempts, a tool loop's model turns, a hook's rate.
    max_runtime_seconds: int = DEFAULT_MAX_RUNTIME_SECONDS
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    max_steps: int = DEFAULT_MAX_STEPS
    max_rate_per_minute: int = DEFAULT_MAX_RATE_PER_MINUTE
    # The run function (kairos.execution.sqs): runs of one batch executed at once.
    run_concurrency_per_invocation: int = DEFAULT_RUN_CONCURRENCY_PER_INVOCATION
    # The console's sign-in (kairos.api.routes.console): the OIDC issuer the JWT authorizer trusts, the
    # console's client id and scopes (none set: the console asks for a bearer token), and the DLQ the
    # operator status reads (kairos.api.routes.status).
    console_issuer: str | None = None
    console_client_id: str | None = None
    console_scopes: str = "openid"
    # Set when the issuer's discovery document is not reachable from a browser (Cognito: the hosted
    # domain serves both); otherwise the console reads them from <issuer>/.well-known/openid-configuration.
    console_authorize_url: str | None = None
    console_token_url: str | None = None
    run_dlq_url: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = dict(os.environ if env is None else env)
        # In the table's order, so the first variable refused is the same one whatever else is wrong.
        values = {name: read(env.get(variable)) for variable, (name, read) in _READERS.items()}
        # RDS Proxy pins every session that prepares a statement: behind it, nothing is prepared.
        values["prepared_statements"] = values["prepared_statements"] and not env.get("DATABASE_PROXY_HOST")
        return cls(**values)

    @property
    def readable_corpus_buckets(self) -> tuple[str, ...]:
        """The buckets a corpus may read: ``corpus_buckets`` less the export bucket, which holds every
        owner's exports under ``exports/<owner>/`` (an owner named ``exports`` would own that prefix)."""
        return tuple(b for b in self.corpus_buckets if b != self.export_bucket)

    def resolve_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        if self.database_secret_arn:
            return _url_from_secret(self.database_secret_arn, self.database_proxy_host)
        raise RuntimeError("set DATABASE_URL or DATABASE_SECRET_ARN")


# Each variable: the setting it sets, and how its value (None when unset) is read.
_READERS: dict[str, tuple[str, Callable[[str | None], Any]]] = {
    "DATABASE_URL": ("database_url", _set),
    "DATABASE_SECRET_ARN": ("database_secret_arn", _set),
    "RUN_QUEUE_URL": ("run_queue_url", _set),
    "DATABASE_PROXY_HOST": ("database_proxy_host", _set),
    "KAIROS_PREPARED_STATEMENTS": ("prepared_statements", _on),
    "KAIROS_PIPELINE": ("pipeline", _on),
    "KAIROS_AUTH": ("auth", _auth),
    "KAIROS_DEV_TOKENS": ("dev_tokens", _dev_tokens),
    "KAIROS_PUBLIC_URL": ("public_url", _public_url),
    "KAIROS_EGRESS_ALLOW": ("egress_allow", _names),
    "KAIROS_RETENTION_DAYS": ("retention_days", _retention_days),
    "KAIROS_OWNER_CONCURRENCY": ("owner_concurrency", _whole_of(
        "KAIROS_OWNER_CONCURRENCY", DEFAULT_OWNER_CONCURRENCY, MAX_OWNER_CONCURRENCY, "runs")),
    "KAIROS_OWNER_QUEUE_MAX": ("owner_queue_max", _whole_of(
        "KAIROS_OWNER_QUEUE_MAX", DEFAULT_OWNER_QUEUE_MAX, MAX_OWNER_QUEUE_MAX, "runs")),
    "KAIROS_OWNER_DAILY_TOKENS": ("owner_daily_tokens", _whole_of(
        "KAIROS_OWNER_DAILY_TOKENS", DEFAULT_OWNER_DAILY_TOKENS, MAX_OWNER_DAILY_TOKENS, "tokens")),
    "KAIROS_OWNER_DAILY_COST_USD": ("owner_daily_cost_usd", _usd_of(
        "KAIROS_OWNER_DAILY_COST_USD", DEFAULT_OWNER_DAILY_COST_USD, MAX_OWNER_DAILY_COST_USD)),
    "KAIROS_MODEL_PRICES": ("model_prices", _model_prices),
    "KAIROS_CORPUS_BUCKETS": ("corpus_buckets", _names),
    "KAIROS_EXPORT_BUCKET": ("export_bucket", _trimmed),
    "KAIROS_CORPUS_MAX_CONCURRENCY": ("corpus_max_concurrency", _whole_of(
        "KAIROS_CORPUS_MAX_CONCURRENCY", DEFAULT_CORPUS_MAX_CONCURRENCY, MAX_CORPUS_MAX_CONCURRENCY, "partitions")),
    "KAIROS_MAX_RUNTIME_SECONDS": ("max_runtime_seconds", _whole_of(
        "KAIROS_MAX_RUNTIME_SECONDS", DEFAULT_MAX_RUNTIME_SECONDS, RUNTIME_CAP_SECONDS, "seconds")),
    "KAIROS_MAX_ATTEMPTS": ("max_attempts", _whole_of(
        "KAIROS_MAX_ATTEMPTS", DEFAULT_MAX_ATTEMPTS, MAX_MAX_ATTEMPTS, "attempts")),
    "KAIROS_MAX_STEPS": ("max_steps", _whole_of("KAIROS_MAX_STEPS", DEFAULT_MAX_STEPS, MAX_MAX_STEPS, "model turns")),
    "KAIROS_MAX_RATE_PER_MINUTE": ("max_rate_per_minute", _whole_of(
        "KAIROS_MAX_RATE_PER_MINUTE", DEFAULT_MAX_RATE_PER_MINUTE, MAX_MAX_RATE_PER_MINUTE, "deliveries")),
    "KAIROS_RUN_CONCURRENCY_PER_INVOCATION": ("run_concurrency_per_invocation", _whole_of(
        "KAIROS_RUN_CONCURRENCY_PER_INVOCATION", DEFAULT_RUN_CONCURRENCY_PER_INVOCATION,
        MAX_RUN_CONCURRENCY_PER_INVOCATION, "runs")),
    "KAIROS_CONSOLE_ISSUER": ("console_issuer", _issuer),
    "KAIROS_CONSOLE_CLIENT_ID": ("console_client_id", _trimmed),
    "KAIROS_CONSOLE_SCOPES": ("console_scopes", _scopes),
    "KAIROS_CONSOLE_AUTHORIZE_URL": ("console_authorize_url", _trimmed),
    "KAIROS_CONSOLE_TOKEN_URL": ("console_token_url", _trimmed),
    "RUN_DLQ_URL": ("run_dlq_url", _set),
}


@lru_cache(maxsize=8)
def _url_from_secret(arn: str, proxy_host: str | None = None) -> str:
    import boto3  # the Lambda runtime ships boto3; imported here to keep cold starts lean

    raw = boto3.client("secretsmanager").get_secret_value(SecretId=arn)["SecretString"]
    secret = json.loads(raw)
    user = quote(str(secret["username"]), safe="")
    password = quote(str(secret["password"]), safe="")
    host = proxy_host or secret.get("proxy_host") or secret["host"]
    port = 5432 if proxy_host else secret.get("port", 5432)  # RDS Proxy listens on PostgreSQL's default port
    dbname = secret.get("dbname", "postgres")
    return f"postgresql://{user}:{password}@{host}:{port}/{dbname}?sslmode=require"
