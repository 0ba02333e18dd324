"""Settings read from the environment (the contract table of DESIGN.md), validated once.

``DATABASE_URL`` wins; otherwise ``DATABASE_SECRET_ARN`` names a Secrets Manager secret in the RDS
shape (``{"host", "port", "username", "password", "dbname"}``) that is read once per container.
``DATABASE_PROXY_HOST`` (an RDS Proxy endpoint) replaces the secret's host when set.

A frozen dataclass, not a pydantic model: every handler reads it on its cold path, and ``from_env``
already parses each variable into its type, so importing pydantic here would only add to every
cold start (the tick and the run function never need pydantic otherwise).

A value that cannot mean anything (``KAIROS_RETENTION_DAYS=thirty``) is refused with
``SettingInvalid`` naming the variable and the rule, so a misconfigured function fails its cold start
loudly instead of running with a guess.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Literal
from urllib.parse import quote

DEFAULT_RETENTION_DAYS = 30
MAX_RETENTION_DAYS = 3650


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
    # How long run threads and webhook payloads of ended runs are kept (kairos.tick.prune).
    retention_days: int = DEFAULT_RETENTION_DAYS

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
            auth="dev" if env.get("KAIROS_AUTH", "jwt") == "dev" else "jwt",
            dev_tokens=tokens,
            public_url=(env.get("KAIROS_PUBLIC_URL") or "").rstrip("/") or None,
            egress_allow=tuple(
                h.strip() for h in env.get("KAIROS_EGRESS_ALLOW", "").split(",") if h.strip()
            ),
            retention_days=_retention_days(env.get("KAIROS_RETENTION_DAYS")),
        )

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
