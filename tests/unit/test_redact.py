"""Redaction and bounding of step previews (kairos.redact, kairos.runs.steps.preview): pure functions."""

from __future__ import annotations

import hashlib
import json

import pytest

from kairos import redact
from kairos.runs import steps


@pytest.mark.parametrize("key", ["Authorization", "proxy-authorization", "Cookie", "Set-Cookie", "X-Auth-Token",
                                 "access_token", "client_secret", "PASSWORD", "api_key", "Api-Key", "apikey",
                                 "OPENAI_API_KEY"])
def test_values_under_credential_keys_are_redacted(key: str) -> None:
    assert redact.redact({key: "v", "kept": "v"}) == {key: "[redacted]", "kept": "v"}


def test_a_credential_key_hides_a_whole_nested_value_at_any_depth() -> None:
    value = {"a": [{"b": {"token": {"id": 1, "value": "x"}}}], "n": 3, "ok": True, "none": None}
    assert redact.redact(value) == {"a": [{"b": {"token": "[redacted]"}}], "n": 3, "ok": True, "none": None}


def test_a_resolved_secret_is_redacted_where_a_string_equals_or_contains_it() -> None:
    secret = "sk-live-0123456789"
    value = {"echo": secret, "note": f"key={secret}; again {secret}", "list": [secret, "other"]}
    assert redact.redact(value, [secret]) == {
        "echo": "[redacted]", "note": "key=[redacted]; again [redacted]", "list": ["[redacted]", "other"]}


def test_a_short_secret_is_redacted_only_where_a_string_equals_it() -> None:
    assert redact.redact(["abc", "abcdef and more"], ["abc"]) == ["[redacted]", "abcdef and more"]


def test_json_text_is_redacted_as_its_document() -> None:
    inner = json.dumps({"api_key": "k", "data": 1})
    outer = json.dumps({"status": 200, "body": inner})
    cleaned = json.loads(redact.redact(outer))
    assert json.loads(cleaned["body"]) == {"api_key": "[redacted]", "data": 1}


def test_text_that_needs_nothing_comes_back_equal() -> None:
    for value in ("{not json}", '{"a": 1}', "plain", {"a": ["b", 1.5]}):
        assert redact.redact(value, ["a-long-secret"]) == value


def test_secrets_of_reads_credential_headers_and_their_credential_part() -> None:
    found = redact.secrets_of({"Authorization": "Bearer sk-1234567890", "Content-Type": "application/json",
                               "X-Api-Key": "xk-1234567890"})
    assert found == {"Bearer sk-1234567890", "sk-1234567890", "xk-1234567890"}


def test_headers_keep_names_only() -> None:
    assert redact.headers({"Authorization": "Bearer x", "Accept": "*/*"}) == {
        "Authorization": "[redacted]", "Accept": "[redacted]"}


def test_a_small_preview_is_the_redacted_value() -> None:
    assert steps.preview({"password": "p", "a": 1}) == {"password": "[redacted]", "a": 1}


def test_a_large_preview_is_cut_with_size_digest_and_head_within_the_bound() -> None:
    value = {"data": "é" * 5_000}
    whole = json.dumps(value, ensure_ascii=False, sort_keys=True).encode("utf-8")

    cut = steps.preview(value)

    assert cut["truncated"] is True
    assert (cut["bytes"], cut["sha256"]) == (len(whole), hashlib.sha256(whole).hexdigest())
    assert whole.decode("utf-8").startswith(cut["head"])
    assert len(json.dumps(cut, ensure_ascii=False).encode("utf-8")) <= steps.PREVIEW_BYTES


def test_a_value_of_exactly_the_bound_is_kept_whole() -> None:
    overhead = len(json.dumps({"d": ""}).encode())
    value = {"d": "x" * (steps.PREVIEW_BYTES - overhead)}
    assert steps.preview(value) == value
    assert steps.preview({"d": "x" * (steps.PREVIEW_BYTES - overhead + 1)})["truncated"] is True


def test_a_target_is_method_host_and_path_without_the_query() -> None:
    assert steps.target("post", "https://api.example.com:8443/v1/hook?token=abc") == {
        "method": "POST", "host": "api.example.com:8443", "path": "/v1/hook"}
