"""SnapStart in the template: tick, run and API functions publish versions behind the alias ``live``,
with SnapStart on published versions; every trigger invokes the alias; each handler registers the
runtime hooks of ``kairos.snapstart``.

The trigger checks read the template as CloudFormation receives it (samtranslator's output,
``tests.support.sam``): SAM rewires schedule targets, event source mappings, permissions and the HTTP
API's integrations to the alias only when ``AutoPublishAlias`` is set, and this holds it so.
"""

from __future__ import annotations

import ast
import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from kairos.local.stack import load_function
from tests.support import sam

ROOT = Path(__file__).resolve().parents[2]
FUNCTIONS = {"TickFunction": "tick", "RunFunction": "run", "ApiFunction": "webhook"}
ALIAS = "live"


@cache
def deployed() -> dict[str, Any]:
    return sam.deployed()


@pytest.mark.parametrize("logical_id", sorted(FUNCTIONS))
def test_each_function_publishes_behind_the_alias_with_snapstart(logical_id: str) -> None:
    source = sam.source()
    props = source["Resources"][logical_id]["Properties"]
    assert props["AutoPublishAlias"] == ALIAS
    assert props["SnapStart"] == {"ApplyOn": "PublishedVersions"}
    runtime = props.get("Runtime", source["Globals"]["Function"]["Runtime"])
    assert runtime.startswith("python3.") and int(runtime.split(".")[1]) >= 12  # SnapStart for Python: 3.12+

    resources = deployed()["Resources"]
    assert resources[logical_id]["Properties"]["SnapStart"] == {"ApplyOn": "PublishedVersions"}
    aliases = [r["Properties"] for r in resources.values() if r["Type"] == "AWS::Lambda::Alias"
               and r["Properties"]["FunctionName"] == {"Ref": logical_id}]
    assert [a["Name"] for a in aliases] == [ALIAS]


def alias_of(logical_id: str) -> str:
    return f"{logical_id}Alias{ALIAS}"


def test_the_schedule_rule_targets_the_tick_alias() -> None:
    resources = deployed()["Resources"]
    rules = [r for r in resources.values() if r["Type"] == "AWS::Events::Rule"
             and any("Tick" in json.dumps(t) for t in r["Properties"].get("Targets", []))]
    assert rules
    for rule in rules:
        assert [t["Arn"] for t in rule["Properties"]["Targets"]] == [{"Ref": alias_of("TickFunction")}]


def test_the_run_queue_mapping_invokes_the_run_alias() -> None:
    mappings = [r["Properties"] for r in deployed()["Resources"].values()
                if r["Type"] == "AWS::Lambda::EventSourceMapping"]
    assert [m["FunctionName"] for m in mappings] == [{"Ref": alias_of("RunFunction")}]


def test_every_http_api_integration_invokes_the_api_alias() -> None:
    resources = deployed()["Resources"]
    body = next(r for r in resources.values() if r["Type"] == "AWS::ApiGatewayV2::Api")["Properties"]["Body"]
    uris = [op["x-amazon-apigateway-integration"]["uri"]["Fn::Sub"]
            for path in body["paths"].values() for op in path.values() if "x-amazon-apigateway-integration" in op]
    assert uris and all(f"${{{alias_of('ApiFunction')}}}" in uri for uri in uris)


def test_invoke_permissions_and_invoke_configs_name_the_alias() -> None:
    resources = deployed()["Resources"]
    for resource in resources.values():
        props = resource.get("Properties", {})
        if resource["Type"] == "AWS::Lambda::Permission" and props.get("Principal") in (
                "events.amazonaws.com", "apigateway.amazonaws.com"):
            assert props["FunctionName"] in ({"Ref": alias_of(f)} for f in FUNCTIONS), props
        if resource["Type"] == "AWS::Lambda::EventInvokeConfig" and props["FunctionName"] in (
                {"Ref": f} for f in FUNCTIONS):
            assert props["Qualifier"] == ALIAS


def registers_hooks_at_import(source: str) -> bool:
    """``snapstart.register(...)`` as a module-level statement of an ``app.py``."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            func = node.value.func
            if isinstance(func, ast.Attribute) and func.attr == "register" and getattr(func.value, "id", "") == \
                    "snapstart":
                return True
    return False


@pytest.mark.parametrize("function", sorted(FUNCTIONS.values()))
def test_each_handler_registers_the_hooks(function: str) -> None:
    import snapshot_restore_py as library

    from kairos import snapstart

    assert registers_hooks_at_import((ROOT / "functions" / function / "app.py").read_text(encoding="utf-8"))
    load_function(function)
    before = [entry[0] for entry in library._before_snapshot_registry]
    after = [entry[0] for entry in library._after_restore_registry]
    assert snapstart.before_snapshot in before and snapstart.after_restore in after
