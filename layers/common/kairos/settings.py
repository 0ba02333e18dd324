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
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Literal
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
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        env = dict(os.environ if env is None else env)
        tokens: dict[str, str] = {}
        for pair in filter(None, (p.strip() for p in env.get("KAIROS_DEV_TOKENS", "").split(","))):
            token, _, principal = pair.partition("=")
            if token and principal:
                tokens[token.strip()] = principal.strip()
        return cls(
            database_url=env.get("DATABASE_URL") or None,
            database_secret_arn=env.get("DATABASE_SECRET_ARN") or None,
            run_queue_url=env.get("RUN_QUEUE_URL") or None,
            database_proxy_host=env.get("DATABASE_PROXY_HOST") or None,
            prepared_statements=not env.get("DATABASE_PROXY_HOST")
            and env.get("KAIROS_PREPARED_STATEMENTS", "on").strip().lower() not in ("off", "false", "0"),
            pipeline=env.get("KAIROS_PIPELINE", "on").strip().lower() not in ("off", "false", "0"),
            auth="dev" if env.get("KAIROS_AUTH", "jwt") == "dev" else "jwt",
            dev_tokens=tokens,
            public_url=(env.get("KAIROS_PUBLIC_URL") or "").rstrip("/") or None,
            egress_allow=tuple(
                h.strip() for h in env.get("KAIROS_EGRESS_ALLOW", "").split(",") if h.strip()
            ),
            retention_days=_retention_days(env.get("KAIROS_RETENTION_DAYS")),
            owner_concurrency=_whole("KAIROS_OWNER_CONCURRENCY", env.get("KAIROS_OWNER_CONCURRENCY"),
                                     DEFAULT_OWNER_CONCURRENCY, 1, MAX_OWNER_CONCURRENCY, "runs"),
            owner_queue_max=_whole("KAIROS_OWNER_QUEUE_MAX", env.get("KAIROS_OWNER_QUEUE_MAX"),
                                   DEFAULT_OWNER_QUEUE_MAX, 1, MAX_OWNER_QUEUE_MAX, "runs"),
            owner_daily_tokens=_whole("KAIROS_OWNER_DAILY_TOKENS", env.get("KAIROS_OWNER_DAILY_TOKENS"),
                                      DEFAULT_OWNER_DAILY_TOKENS, 1, MAX_OWNER_DAILY_TOKENS, "tokens"),
            owner_daily_cost_usd=_usd("KAIROS_OWNER_DAILY_COST_USD", env.get("KAIROS_OWNER_DAILY_COST_USD"),
                                      DEFAULT_OWNER_DAILY_COST_USD, MAX_OWNER_DAILY_COST_USD),
            model_prices=_model_prices(env.get("KAIROS_MODEL_PRICES")),
            corpus_buckets=tuple(b.strip() for b in env.get("KAIROS_CORPUS_BUCKETS", "").split(",") if b.strip()),
            export_bucket=(env.get("KAIROS_EXPORT_BUCKET") or "").strip() or None,
            corpus_max_concurrency=_whole("KAIROS_CORPUS_MAX_CONCURRENCY", env.get("KAIROS_CORPUS_MAX_CONCURRENCY"),
                                          DEFAULT_CORPUS_MAX_CONCURRENCY, 1, MAX_CORPUS_MAX_CONCURRENCY, "partitions"),
            console_issuer=(env.get("KAIROS_CONSOLE_ISSUER") or "").strip().rstrip("/") or None,
            console_client_id=(env.get("KAIROS_CONSOLE_CLIENT_ID") or "").strip() or None,
            console_scopes=" ".join((env.get("KAIROS_CONSOLE_SCOPES") or "openid").replace(",", " ").split())
            or "openid",
            console_authorize_url=(env.get("KAIROS_CONSOLE_AUTHORIZE_URL") or "").strip() or None,
            console_token_url=(env.get("KAIROS_CONSOLE_TOKEN_URL") or "").strip() or None,
            run_dlq_url=env.get("RUN_DLQ_URL") or None,
        )

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
