"""The README and docs name commands that work as written.

* A build is ``./scripts/build`` (``sam build`` with the SAM CLI's Python 3.12 first on PATH): no
  shell block or inline command in the docs runs ``sam build`` directly, which fails where
  ``python3.12`` on PATH is pyenv's shim for a version that is not selected; ``scripts/deploy`` and
  ``scripts/test`` build through ``scripts/build``.
* The local stack's tick interval the README states is ``kairos dev``'s default.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from kairos import cli

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"```(?:sh|bash|console)?\n(.*?)```", re.S)
_SPAN = re.compile(r"`([^`\n]+)`")
_SAM_BUILD = re.compile(r"(?:^|[;&|(]\s*)(?:\S*/)?sam build\b")


def direct_sam_builds(text: str) -> list[str]:
    """Commands in ``text`` (shell blocks less their comments, and inline code that is more than the
    tool's name) that run ``sam build`` themselves rather than through ``scripts/build``."""
    found = []
    for block in _FENCE.findall(text):
        for line in block.splitlines():
            command = line.split("#", 1)[0].strip()
            if _SAM_BUILD.search(command):
                found.append(command)
    outside = _FENCE.sub("", text)
    for span in _SPAN.findall(outside):
        if span.strip() != "sam build" and _SAM_BUILD.search(span.strip()):
            found.append(span)
    return found


def test_the_docs_build_through_scripts_build() -> None:
    offending = {path.name: found for path in DOCS if (found := direct_sam_builds(path.read_text(encoding="utf-8")))}
    assert offending == {}
    assert any("./scripts/build" in path.read_text(encoding="utf-8") for path in DOCS)


def test_the_check_finds_a_direct_sam_build() -> None:
    assert direct_sam_builds("```sh\n.venv-sam/bin/sam build\n./scripts/build  # runs sam build\n```\n") == [
        ".venv-sam/bin/sam build"]
    assert direct_sam_builds("then a plain `sam build && sam deploy` redeploys; `sam build` is the tool") == [
        "sam build && sam deploy"]
    assert direct_sam_builds("`./scripts/build && .venv-sam/bin/sam deploy`") == []


def test_scripts_build_puts_python_312_first_and_the_other_scripts_use_it() -> None:
    build = ROOT / "scripts" / "build"
    assert os.access(build, os.X_OK)
    text = build.read_text(encoding="utf-8")
    path_line = text.index('PATH="$(dirname "$(readlink -f .venv-sam/bin/python)"):$PATH"')
    assert "scripts/bootstrap-sam" in text and path_line < text.index("exec .venv-sam/bin/sam build \"$@\"")
    for name in ("deploy", "test"):
        script = (ROOT / "scripts" / name).read_text(encoding="utf-8")
        assert "scripts/build " in script, name
        assert not re.search(r"bin/sam build", script), name


def test_the_readme_states_the_local_tick_interval() -> None:
    dev = cli.build_parser().parse_args(["dev"])
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    stated = re.search(r"a tick every (\d+) s\b", readme)
    assert stated is not None, "the README says how often the local stack ticks"
    assert float(stated.group(1)) == dev.tick_seconds
    assert "every few seconds" not in readme
