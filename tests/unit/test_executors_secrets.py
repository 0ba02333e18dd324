"""Resolving ``api_key_secret``: ``env:NAME`` and Secrets Manager ARNs (moto, in process), the
per-container cache, and failures that never reveal the secret."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from kairos import secrets
from kairos.executors.base import ExecutorError
from moto import mock_aws

REGION = "eu-central-1"


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    secrets.clear_cache()
    yield
    secrets.clear_cache()


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        yield boto3.client("secretsmanager", region_name=REGION)


def unavailable(reference: str, **kwargs: Any) -> ExecutorError:
    with pytest.raises(ExecutorError) as info:
        secrets.resolve(reference, **kwargs)
    assert info.value.reason_code == "secret_unavailable"
    return info.value


def test_env_references_read_the_environment() -> None:
    assert secrets.resolve("env:OPENAI_API_KEY", env={"OPENAI_API_KEY": "sk-1"}) == "sk-1"
    error = unavailable("env:OPENAI_API_KEY", env={})
    assert "OPENAI_API_KEY" in error.message and not error.retry_safe
    unavailable("env:EMPTY", env={"EMPTY": ""})
    unavailable("env:", env={"": "x"})


def test_other_references_are_refused_without_echoing_them() -> None:
    error = unavailable("sk-live-pasted-key-by-mistake")
    assert "sk-live" not in error.message
    unavailable("arn:aws:s3:::bucket/key")


def test_a_secrets_manager_arn_is_read_and_cached_until_it_expires(aws: Any) -> None:
    client = aws
    arn = client.create_secret(Name="kairos/openai", SecretString="sk-first")["ARN"]
    now = [1000.0]

    assert secrets.resolve(arn, clock=lambda: now[0]) == "sk-first"
    client.put_secret_value(SecretId=arn, SecretString="sk-rotated")
    now[0] += secrets.CACHE_SECONDS - 1
    assert secrets.resolve(arn, clock=lambda: now[0]) == "sk-first"  # cached: no call per run
    now[0] += 2
    assert secrets.resolve(arn, clock=lambda: now[0]) == "sk-rotated"  # a rotation is seen after the TTL


def test_a_json_secret_with_an_api_key_field_yields_that_field(aws: Any) -> None:
    client = aws
    arn = client.create_secret(
        Name="kairos/json", SecretString=json.dumps({"api_key": "sk-json", "org": "o"})
    )["ARN"]
    assert secrets.resolve(arn) == "sk-json"


def test_a_missing_secret_is_unavailable_and_not_retry_safe(aws: Any) -> None:
    arn = f"arn:aws:secretsmanager:{REGION}:123456789012:secret:kairos/absent-AbCdEf"
    error = unavailable(arn)
    assert "ResourceNotFoundException" in error.message and not error.retry_safe
