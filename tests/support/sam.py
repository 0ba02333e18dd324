"""The SAM template as CloudFormation would create it for given parameter values.

``deployed(**parameters)`` translates ``template.yaml`` with samtranslator (the transform SAM CLI and
CloudFormation run), then settles what CloudFormation settles at deploy time: the conditions, each
resource's ``Condition``, ``Fn::If`` and ``AWS::NoValue``. Everything else (``Ref``, ``Fn::GetAtt``,
``Fn::Sub``) is left as written, so tests can follow references between resources.

samtranslator comes with SAM CLI (``.venv-sam``, which ``scripts/bootstrap-sam`` installs; it is not a
dependency of the project's environment, where its pydantic pin would clash with the layer's). When the
test environment lacks it, the translation runs in ``.venv-sam``'s interpreter instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

from cfnlint.decode import decode

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "template.yaml"
REGION = "us-east-1"
_NO_VALUE = object()

_TRANSLATE = """
import json, sys
from samtranslator.translator.transform import transform

class NoManagedPolicies:
    def load(self):
        return {}

request = json.load(sys.stdin)
json.dump(transform(request["template"], request["parameters"], NoManagedPolicies()), sys.stdout)
"""


def source() -> dict[str, Any]:
    """The template as ``sam package`` hands it on: local code paths become S3 locations."""
    loaded, matches = decode(str(TEMPLATE))
    assert not matches, [str(m) for m in matches]
    result: dict[str, Any] = json.loads(json.dumps(loaded))
    for resource in result["Resources"].values():
        for key in ("CodeUri", "ContentUri"):
            if isinstance(resource.get("Properties", {}).get(key), str):
                resource["Properties"][key] = f"s3://artifacts/{resource['Properties'][key]}"
    return result


def _sam_python() -> str:
    try:
        import samtranslator  # noqa: F401
    except ImportError:
        # KAIROS_SAM_PYTHON, the checkout's .venv-sam, or the one beside the virtualenv running the
        # tests (a worktree sharing another checkout's environments).
        for candidate in (os.environ.get("KAIROS_SAM_PYTHON", ""), str(ROOT / ".venv-sam/bin/python"),
                          str(Path(sys.prefix).parent / ".venv-sam/bin/python")):
            if candidate and Path(candidate).exists():
                return candidate
        raise RuntimeError("samtranslator is missing: run scripts/bootstrap-sam") from None
    return sys.executable


@cache
def _translated(parameters: tuple[tuple[str, str], ...]) -> str:
    request = json.dumps({"template": source(), "parameters": dict(parameters)})
    env = {**os.environ, "AWS_DEFAULT_REGION": REGION, "AWS_REGION": REGION}
    done = subprocess.run([_sam_python(), "-c", _TRANSLATE], input=request, capture_output=True, text=True,
                          env=env, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def deployed(**parameters: str) -> dict[str, Any]:
    """The translated template with the conditions settled for ``parameters`` (others at their defaults)."""
    translated: dict[str, Any] = json.loads(_translated(tuple(sorted(parameters.items()))))
    values = {name: str(spec.get("Default", "")) for name, spec in translated["Parameters"].items()}
    values.update(parameters)
    kinds = {name: spec["Type"] for name, spec in translated["Parameters"].items()}
    settled = _Settler(values, kinds, translated.get("Conditions", {}))
    resources = {
        name: settled.value(resource)
        for name, resource in translated["Resources"].items()
        if "Condition" not in resource or settled.condition(resource["Condition"])
    }
    outputs = {
        name: settled.value(output)
        for name, output in translated.get("Outputs", {}).items()
        if "Condition" not in output or settled.condition(output["Condition"])
    }
    return {"Resources": resources, "Outputs": outputs}


class _Settler:
    def __init__(self, values: dict[str, str], kinds: dict[str, str], conditions: dict[str, Any]) -> None:
        self.values, self.kinds, self.conditions = values, kinds, conditions

    def condition(self, name: str) -> bool:
        return bool(self._evaluate(self.conditions[name]))

    def _evaluate(self, node: Any) -> Any:
        """Condition functions over parameters (what Conditions may contain)."""
        if isinstance(node, str | int | float | bool):
            return node
        if isinstance(node, list):
            return [self._evaluate(item) for item in node]
        ((function, argument),) = node.items()
        if function == "Ref":
            value = self.values[argument]
            return value.split(",") if self.kinds.get(argument) == "CommaDelimitedList" else value
        if function == "Condition":
            return self.condition(argument)
        if function == "Fn::Equals":
            left, right = self._evaluate(argument)
            return str(left) == str(right)
        if function == "Fn::Not":
            return not self._evaluate(argument[0])
        if function == "Fn::And":
            return all(self._evaluate(item) for item in argument)
        if function == "Fn::Or":
            return any(self._evaluate(item) for item in argument)
        if function == "Fn::Join":
            separator, items = argument
            return separator.join(str(i) for i in self._evaluate(items))
        raise AssertionError(f"condition function {function} not handled")

    def value(self, node: Any) -> Any:
        """``node`` with Fn::If settled and AWS::NoValue removed."""
        if isinstance(node, list):
            return [v for v in (self.value(item) for item in node) if v is not _NO_VALUE]
        if not isinstance(node, dict):
            return node
        if set(node) == {"Fn::If"}:
            name, when_true, when_false = node["Fn::If"]
            return self.value(when_true if self.condition(name) else when_false)
        if node == {"Ref": "AWS::NoValue"}:
            return _NO_VALUE
        return {k: v for k, v in ((k, self.value(v)) for k, v in node.items()) if v is not _NO_VALUE}
