"""Secret references as capabilities (docs/api.md "Credentials"): which references an owner may use,
where a shared key may travel, and resolving them (``env:`` and Secrets Manager through moto, in
process), with the per-container cache and failures that never reveal a secret.

Each refusal here was an exfiltration before: ``env:AWS_SECRET_ACCESS_KEY`` sent as a bearer token to
any ``base_url``, any ARN read with the run role, the database secret among them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from moto import mock_aws

from kairos import secrets
from kairos.errors import NotFound, ValidationFailed
from kairos.secrets import SecretUnavailable

REGION = "eu-central-1"
ACCOUNT = "123456789012"
MODEL = "https://api.openai.com/v1"
POLICY = secrets.Policy.from_env({
    "KAIROS_SHARED_SECRETS": "env:OPENAI_API_KEY@api.openai.com, env:LOCAL_KEY@http://127.0.0.1:8080",
    "DATABASE_SECRET_ARN": f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:kairos/alice/db-AbCdEf",
})
# The function's own environment: what an agent must never be able to name.
FUNCTION_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID", "DATABASE_URL",
                "DATABASE_SECRET_ARN", "KAIROS_DEV_TOKENS", "PATH", "HOME")


def arn(name: str, *, region: str = REGION) -> str:
    return f"arn:aws:secretsmanager:{region}:{ACCOUNT}:secret:{name}"


def refused(reference: str, *, owner: str = "alice", audience: str | None = MODEL,
            policy: secrets.Policy = POLICY) -> str:
    with pytest.raises(secrets.Refused) as info:
        secrets.check(reference, owner=owner, audience=audience, policy=policy)
    return info.value.rule


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    secrets.clear_cache()
    yield
    secrets.clear_cache()


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": REGION}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("KAIROS_SECRET_PREFIX", raising=False)
    with mock_aws():
        yield boto3.client("secretsmanager", region_name=REGION)


# --- env: only what the operator shares, only to its host -----------------------------------------


@pytest.mark.parametrize("name", FUNCTION_ENV)
def test_the_function_environment_can_never_be_named(name: str) -> None:
    assert refused(f"env:{name}") == "secret_reference"
    assert refused(f"env:{name}", audience=None) == "secret_reference"
    with pytest.raises(SecretUnavailable) as info:  # and again at the call, with the variable set
        secrets.resolve(f"env:{name}", owner="alice", audience=MODEL, policy=POLICY, env={name: "the-value"})
    assert info.value.reason_code == "secret_unavailable" and not info.value.retry_safe
    assert "the-value" not in info.value.message


@given(name=st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,40}", fullmatch=True),
       host=st.sampled_from(["api.openai.com", "evil.example", "127.0.0.1", "169.254.169.254"]))
@settings(max_examples=300, deadline=None)
def test_an_env_reference_is_valid_only_for_a_listed_name_and_host(name: str, host: str) -> None:
    listed = {("OPENAI_API_KEY", "api.openai.com")}
    reference, audience = f"env:{name}", f"https://{host}/v1"
    if (name, host) in listed:
        secrets.check(reference, owner="alice", audience=audience, policy=POLICY)
    elif name in {n for n, _ in listed} or name == "LOCAL_KEY":
        assert refused(reference, audience=audience) == "secret_audience"
    else:
        assert refused(reference, audience=audience) == "secret_reference"


def test_a_shared_key_goes_to_its_host_only() -> None:
    secrets.check("env:OPENAI_API_KEY", owner="anyone", audience="https://API.OpenAI.com./v1", policy=POLICY)
    assert refused("env:OPENAI_API_KEY", audience="https://api.openai.com.evil.example/v1") == "secret_audience"
    assert refused("env:OPENAI_API_KEY", audience="https://evil.example/v1?h=api.openai.com") == "secret_audience"
    assert refused("env:OPENAI_API_KEY", audience=None) == "secret_audience"  # a signing secret has no host
    # An entry with a port binds the port too.
    secrets.check("env:LOCAL_KEY", owner="alice", audience="http://127.0.0.1:8080/v1", policy=POLICY)
    assert refused("env:LOCAL_KEY", audience="http://127.0.0.1:9090/v1") == "secret_audience"
    assert refused("env:LOCAL_KEY", audience="http://127.0.0.1/v1") == "secret_audience"


def test_shared_keys_resolve_from_the_environment_only_when_set() -> None:
    env = {"OPENAI_API_KEY": "sk-shared"}
    assert secrets.resolve("env:OPENAI_API_KEY", owner="bob", audience=MODEL, policy=POLICY, env=env) == "sk-shared"
    with pytest.raises(SecretUnavailable) as info:
        secrets.resolve("env:OPENAI_API_KEY", owner="bob", audience=MODEL, policy=POLICY, env={})
    assert info.value.reason_code == "secret_unavailable" and not info.value.retry_safe


def test_malformed_shared_entries_share_nothing() -> None:
    policy = secrets.Policy.from_env({"KAIROS_SHARED_SECRETS": "OPENAI_API_KEY@api.openai.com,env:K,env:K@,"
                                                               "env:K@h:notaport,env:K@u@h,env:OK@ok.example"})
    assert policy.shared == frozenset({("OK", "https", "ok.example", 443)})
    odd = secrets.Policy.from_env({"KAIROS_SHARED_SECRETS": "env:K@ftp://h,env:K@https://h/v1,env:K@h:8080:*,"
                                                            "env:K@http://h:*:1,env:K@http://"})
    assert odd.shared == frozenset()


def test_a_shared_key_travels_only_over_https_to_the_default_port_unless_its_entry_says_otherwise() -> None:
    # A bare host is https on 443: not in clear text, not to another port of the same host.
    secrets.check("env:OPENAI_API_KEY", owner="alice", audience="https://api.openai.com:443/v1", policy=POLICY)
    for audience in ("http://api.openai.com:25/", "http://api.openai.com/v1", "https://api.openai.com:8443/v1",
                     "HTTP://api.openai.com:443/v1"):
        assert refused("env:OPENAI_API_KEY", audience=audience) == "secret_audience", audience
    with pytest.raises(secrets.Refused) as info:
        secrets.check("env:OPENAI_API_KEY", owner="alice", audience="http://api.openai.com:25/", policy=POLICY)
    assert "https://api.openai.com;" in info.value.message
    # An entry may name the scheme, a port, or any port (':*') of its host.
    policy = secrets.Policy.from_env({"KAIROS_SHARED_SECRETS": "env:A@http://local.test, env:B@https://llm.test:8443,"
                                                               "env:C@llm.test:8443, env:D@http://127.0.0.1:*,"
                                                               "env:E@HTTPS://[::1]:9443"})
    allowed = [("A", "http://local.test/v1"), ("A", "http://local.test:80/v1"), ("B", "https://llm.test:8443/v1"),
               ("C", "https://llm.test:8443/v1"), ("D", "http://127.0.0.1:41234/v1"), ("D", "http://127.0.0.1/v1"),
               ("E", "https://[::1]:9443/v1")]
    refused_ = [("A", "https://local.test/v1"), ("A", "http://local.test:8080/v1"), ("B", "http://llm.test:8443/v1"),
                ("C", "http://llm.test:8443/v1"), ("C", "https://llm.test/v1"), ("D", "https://127.0.0.1:41234/v1"),
                ("D", "http://localhost:41234/v1"), ("E", "http://[::1]:9443/v1")]
    for name, audience in allowed:
        secrets.check(f"env:{name}", owner="alice", audience=audience, policy=policy)
    for name, audience in refused_:
        assert refused(f"env:{name}", audience=audience, policy=policy) == "secret_audience", (name, audience)


# --- ARNs: only the caller's namespace, never the database secret ----------------------------------


@pytest.mark.parametrize("name", [
    "kairos/alice/openai", "kairos/alice/openai-AbCdEf", "kairos/alice/team/key",
])
def test_an_owner_may_name_their_own_secrets(name: str) -> None:
    secrets.check(arn(name), owner="alice", audience=MODEL, policy=POLICY)
    secrets.check(arn(name, region="us-west-2"), owner="alice", audience=None, policy=POLICY)


@pytest.mark.parametrize("name", [
    "kairos/bob/openai",  # another owner's key
    "kairos/alice",  # the namespace itself is no secret of alice's
    "kairos/alice-evil/openai",  # a prefix of the owner is not the owner
    "kairos/alicex/openai",
    "kairos/ALICE/openai",  # names are case-sensitive, and so are principals
    "kairos/alice/../bob/openai",  # path tricks: refused outright, whatever the service makes of them
    "kairos/alice/./openai",
    "kairos/alice//openai",
    "kairos/alice/",
    "other/alice/openai",  # outside the prefix
    "alice/openai",
    "kairos-database",  # "kairos*" without the slash matched this before
    "kairos/alice/db-AbCdEf",  # the database secret, even inside the namespace
    "kairos/alice/db",  # … and its partial ARN
])
def test_every_other_arn_is_refused(name: str) -> None:
    assert refused(arn(name)) == "secret_reference"


def test_references_of_other_services_and_literals_are_refused_without_echoing_them() -> None:
    for reference in ("sk-live-pasted-key-by-mistake", "arn:aws:s3:::bucket/key", "ENV:KEY", "env:",
                      f"arn:aws:secretsmanager:{REGION}:1:secret:kairos/alice/x", "kairos/alice/x"):
        with pytest.raises(secrets.Refused) as info:
            secrets.check(reference, owner="alice", audience=MODEL, policy=POLICY)
        assert info.value.rule == "secret_reference"
        assert "pasted" not in info.value.message


@pytest.mark.parametrize("owner", ["auth0|123", "a/b", "..", ".", "=x", "a" * 200, "ü"])
def test_owners_that_are_not_plain_name_segments_get_a_hashed_namespace(owner: str) -> None:
    mine = secrets.namespace(owner, POLICY)
    assert mine.startswith("kairos/=") and mine.count("/") == 2
    secrets.check(arn(mine + "key"), owner=owner, audience=MODEL, policy=POLICY)
    assert refused(arn(mine + "key"), owner=owner + "x") == "secret_reference"
    assert refused(arn("kairos/" + owner + "/key"), owner=owner) == "secret_reference"


def test_the_prefix_comes_from_the_environment() -> None:
    policy = secrets.Policy.from_env({"KAIROS_SECRET_PREFIX": "/acme/agents/"})
    assert secrets.namespace("alice", policy) == "acme/agents/alice/"
    secrets.check(arn("acme/agents/alice/k"), owner="alice", audience=MODEL, policy=policy)
    assert refused(arn("kairos/alice/k"), policy=policy) == "secret_reference"
    assert secrets.Policy.from_env({}).prefix == "kairos"


# --- resolving, storing, listing, deleting (moto) ---------------------------------------------------


def test_an_owned_arn_is_read_and_cached_until_it_expires(aws: Any) -> None:
    client = aws
    reference = client.create_secret(Name="kairos/alice/openai", SecretString="sk-first")["ARN"]
    now = [1000.0]

    def read() -> str:
        return secrets.resolve(reference, owner="alice", audience=MODEL, clock=lambda: now[0])

    assert read() == "sk-first"
    client.put_secret_value(SecretId=reference, SecretString="sk-rotated")
    now[0] += secrets.CACHE_SECONDS - 1
    assert read() == "sk-first"  # cached: no call per run
    now[0] += 2
    assert read() == "sk-rotated"  # a rotation is seen after the TTL


def test_another_owners_existing_secret_is_refused_before_any_read(aws: Any) -> None:
    bobs = aws.create_secret(Name="kairos/bob/openai", SecretString="sk-bob")["ARN"]
    with pytest.raises(SecretUnavailable) as info:
        secrets.resolve(bobs, owner="alice", audience=MODEL)
    assert info.value.reason_code == "secret_unavailable" and not info.value.retry_safe
    assert "sk-bob" not in info.value.message
    assert secrets.resolve(bobs, owner="bob", audience=MODEL) == "sk-bob"


def test_a_json_secret_with_an_api_key_field_yields_that_field(aws: Any) -> None:
    reference = aws.create_secret(Name="kairos/alice/json",
                                  SecretString=json.dumps({"api_key": "sk-json", "org": "o"}))["ARN"]
    assert secrets.resolve(reference, owner="alice", audience=MODEL) == "sk-json"


def test_a_missing_secret_is_unavailable_and_not_retry_safe(aws: Any) -> None:
    with pytest.raises(SecretUnavailable) as info:
        secrets.resolve(arn("kairos/alice/absent-AbCdEf"), owner="alice", audience=MODEL)
    assert info.value.reason_code == "secret_unavailable"
    assert "ResourceNotFoundException" in info.value.message and not info.value.retry_safe


def test_store_list_and_delete_keep_to_the_owners_namespace(aws: Any) -> None:
    stored, created = secrets.store("alice", "openai", "sk-alice-1")
    again, created_again = secrets.store("alice", "openai", "sk-alice-2")
    secrets.store("bob", "openai", "sk-bob")
    secrets.store("alice-evil", "x", "sk-evil")  # a neighbour whose name starts with alice's

    assert created and not created_again and stored.reference == again.reference
    assert aws.describe_secret(SecretId=stored.reference)["Name"] == "kairos/alice/openai"
    assert secrets.resolve(stored.reference, owner="alice", audience=MODEL) == "sk-alice-2"
    assert [s.name for s in secrets.list_owned("alice")] == ["openai"]
    assert [s.name for s in secrets.list_owned("bob")] == ["openai"]
    assert secrets.list_owned("carol") == []

    secrets.delete("alice", "openai")
    assert secrets.list_owned("alice") == []
    with pytest.raises(NotFound):
        secrets.delete("alice", "openai")
    with pytest.raises(SecretUnavailable):  # gone at once, and not served from this process's cache
        secrets.resolve(stored.reference, owner="alice", audience=MODEL)
    assert [s.name for s in secrets.list_owned("bob")] == ["openai"]


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "../bob/openai", "x" * 129, "white space", "ü"])
def test_store_refuses_names_outside_one_segment(aws: Any, name: str) -> None:
    with pytest.raises(ValidationFailed) as info:
        secrets.store("alice", name, "v")
    assert [(f.field, f.rule) for f in info.value.fields] == [("name", "pattern")]
    assert aws.list_secrets()["SecretList"] == []


def test_the_store_being_down_is_a_503_not_a_500(monkeypatch: pytest.MonkeyPatch) -> None:
    from kairos.errors import ServiceUnavailable, http_status

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    with pytest.raises(ServiceUnavailable) as info:
        secrets.store("alice", "openai", "sk-never-logged")
    assert http_status(info.value) == 503 and "sk-never" not in info.value.message
    assert os.environ["AWS_ENDPOINT_URL"].endswith(":9")
