"""A schedule's ``notify`` field, checked on its own (``validate_notify``): terminal states only, each once;
an https URL (http only to a listed host, a literal address through the egress check); a secret that is a
reference to one of the owner's own keys. Every refusal names ``notify.<field>`` and a rule."""

from __future__ import annotations

from typing import Any

import pytest

from kairos.errors import ValidationFailed
from kairos.notify import NOTIFY_ON_DEFAULT, validate_notify

ALICE_REF = "arn:aws:secretsmanager:us-east-1:123456789012:secret:kairos/alice/hook-AbC123"
BOB_REF = "arn:aws:secretsmanager:us-east-1:123456789012:secret:kairos/bob/hook-AbC123"


def hook(url: str = "https://hooks.example.com/kairos", secret: str = ALICE_REF) -> dict[str, Any]:
    return {"on": ["failed"], "webhook": {"url": url, "secret": secret}}


def refusals(raw: object, allow: tuple[str, ...] = ()) -> set[tuple[str, str]]:
    with pytest.raises(ValidationFailed) as caught:
        validate_notify(raw, owner="alice", allow=allow)
    for problem in caught.value.fields:
        assert problem.message
    return {(p.field, p.rule) for p in caught.value.fields}


def test_the_default_reports_every_unhappy_end_to_the_inbox_only() -> None:
    assert validate_notify({}, owner="alice", allow=()) == {"on": [s.value for s in NOTIFY_ON_DEFAULT]}
    assert [s.value for s in NOTIFY_ON_DEFAULT] == ["failed", "abandoned", "expired", "policy_blocked"]
    assert validate_notify({"on": []}, owner="alice", allow=()) == {"on": []}  # nothing reported


def test_a_webhook_is_kept_as_given_with_its_reference() -> None:
    assert validate_notify(hook(), owner="alice", allow=()) == hook()


@pytest.mark.parametrize("state", ["queued", "running", "awaiting_approval", "done", "FAILED", ""])
def test_on_takes_terminal_run_states_only(state: str) -> None:
    assert refusals({"on": ["failed", state]}) == {("notify.on", "terminal_state")}


def test_on_names_each_state_once_and_is_a_list_of_strings() -> None:
    assert refusals({"on": ["failed", "failed"]}) == {("notify.on", "duplicate")}
    assert refusals({"on": "failed"}) == {("notify.on", "type")}
    assert refusals({"on": [1]}) == {("notify.on.0", "type")}
    assert refusals({"webhook": {"url": 5, "secret": None}}) == {("notify.webhook.url", "type"),
                                                                 ("notify.webhook.secret", "type")}


def test_unknown_fields_are_refused_at_every_level() -> None:
    assert refusals({"on": ["failed"], "email": "me@example.com"}) == {("notify.email", "unknown_field")}
    body = hook()
    body["webhook"]["headers"] = {"x": "y"}
    assert refusals(body) == {("notify.webhook.headers", "unknown_field")}


def test_notify_must_be_an_object_and_a_webhook_needs_a_state() -> None:
    assert refusals(["failed"]) == {("notify", "type")}
    assert refusals({"on": [], "webhook": hook()["webhook"]}) == {("notify.on", "empty")}


@pytest.mark.parametrize("url", ["ftp://hooks.example.com/x", "hooks.example.com/x", "https://", "https://a b/",
                                 "https://user:pw@hooks.example.com/x", "https://hooks.example.com:99999/x"])
def test_the_url_is_an_http_url_without_credentials(url: str) -> None:
    assert refusals(hook(url)) == {("notify.webhook.url", "url")}


def test_http_only_to_hosts_listed_in_kairos_egress_allow() -> None:
    assert refusals(hook("http://hooks.example.com/x")) == {("notify.webhook.url", "https_required")}
    assert refusals(hook("http://127.0.0.1:8080/x")) == {("notify.webhook.url", "https_required")}
    listed = ("hooks.internal", "127.0.0.0/8")
    assert validate_notify(hook("http://hooks.internal/x"), owner="alice", allow=listed)["webhook"]
    assert validate_notify(hook("http://127.0.0.1:8080/x"), owner="alice", allow=listed)["webhook"]


def test_a_literal_address_must_pass_the_egress_check() -> None:
    for url in ("https://169.254.169.254/latest", "https://10.0.0.5/hook", "https://[::1]/hook"):
        assert refusals(hook(url)) == {("notify.webhook.url", "egress_refused")}, url
    # Listed or not, a metadata address is refused.
    assert refusals(hook("http://169.254.169.254/x"), allow=("169.254.0.0/16",)) == {
        ("notify.webhook.url", "egress_refused")}


@pytest.mark.parametrize("secret", ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "sk-live-abc", ""])
def test_the_secret_is_a_reference_never_the_secret(secret: str) -> None:
    with pytest.raises(ValidationFailed) as caught:
        validate_notify(hook(secret=secret), owner="alice", allow=())
    assert [(p.field, p.rule) for p in caught.value.fields] == [("notify.webhook.secret", "secret_reference")]
    assert not secret or all(secret not in p.message for p in caught.value.fields)


@pytest.mark.parametrize("secret", [BOB_REF, "env:AWS_SECRET_ACCESS_KEY",
                                    "arn:aws:secretsmanager:us-east-1:123456789012:secret:kairos/alice/../bob/k"])
def test_the_secret_is_one_of_the_owners_own(secret: str) -> None:
    found = refusals(hook(secret=secret))
    assert {f for f, _ in found} == {"notify.webhook.secret"}
    assert {r for _, r in found} <= {"secret_reference", "secret_audience"}
