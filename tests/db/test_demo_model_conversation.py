"""The conversation ``kairos dev`` prints for its demo model: made once per owner and demo URL, found
again on the next start (the banner's id stays the same), and a valid ``openai`` agent without a key."""

from __future__ import annotations

from pathlib import Path

import pytest

from kairos import conversations
from kairos.db import Database
from kairos.local import demo_server


def test_the_demo_conversation_is_made_once_per_owner_and_url(db: Database) -> None:
    url = "http://127.0.0.1:8001/v1"
    with db.transaction() as conn:
        first = demo_server.ensure_conversation(conn, owner="alice", base_url=url)
    with db.transaction() as conn:
        assert demo_server.ensure_conversation(conn, owner="alice", base_url=url) == first
        made = conversations.get(conn, first, owner="alice")
        assert made.agent == demo_server.agent(url) and made.title == demo_server.TITLE
        assert "api_key_secret" not in made.agent
        # another owner, or the model on another port, gets its own
        assert demo_server.ensure_conversation(conn, owner="bob", base_url=url) != first
        moved = demo_server.ensure_conversation(conn, owner="alice", base_url="http://127.0.0.1:9001/v1")
        assert moved != first


def test_the_banner_prints_the_same_conversation_on_every_start(db_url: str, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    with demo_server.DemoModelServer() as server:
        first = server.print_banner(db_url, "http://127.0.0.1:8000", owner="alice", token="dev-token-alice")
        again = server.print_banner(db_url, "http://127.0.0.1:8000", owner="alice", token="dev-token-alice")
    out = capsys.readouterr().out
    assert first == again
    assert f"demo model {server.base_url}  (model kairos-demo, no key; runs may reach {server.allow_entry};" in out
    assert out.count(f"conversation {first} uses it (tools: http, schedules)") == 2
    assert (f"try:  curl -sS -X POST http://127.0.0.1:8000/v1/conversations/{first}/messages "
            "-H 'Authorization: Bearer dev-token-alice'") in out
