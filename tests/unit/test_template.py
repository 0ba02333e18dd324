"""The SAM template, the sample events and the built layer keep the relations deployment relies on.

cfn-lint and ``sam validate --lint`` check the template's syntax and AWS's own rules (CI runs both);
these tests check what they cannot know: the queue outlives a run's invocation six times over, the
DLQ catches what fails, every alarm watches a metric the code really emits, the webhook token never
reaches an access log, only the public routes skip the JWT authorizer, each handler exists, and the
events in ``events/`` are shaped like the real ones for the routes the template wires.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from cfnlint.decode import decode

from kairos.observability import METRIC_NAMES

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "template.yaml"
EVENTS = ROOT / "events"

# The routes of docs/api.md, plus the token rotation route the API's issue adds, the console's operator status
# and the console's static files (issue 16).
ROUTES = {
    "POST /v1/conversations",
    "GET /v1/conversations",
    "GET /v1/conversations/{id}",
    "GET /v1/conversations/{id}/inbox",
    "POST /v1/conversations/{id}/messages",
    "POST /v1/schedules",
    "GET /v1/schedules",
    "GET /v1/schedules/{id}",
    "GET /v1/schedules/{id}/preview",
    "GET /v1/schedules/{id}/occurrences",
    "PATCH /v1/schedules/{id}",
    "POST /v1/schedules/{id}/trigger",
    "POST /v1/schedules/{id}/test",
    "POST /v1/schedules/{id}/backfill",
    "POST /v1/runs/{id}/retry",
    "GET /v1/approvals",
    "GET /v1/approvals/{id}",
    "POST /v1/approvals/{id}/approve",
    "POST /v1/approvals/{id}/deny",
    "GET /v1/input-requests",
    "POST /v1/input-requests/{id}/answer",
    "POST /v1/loops",
    "GET /v1/loops/{id}",
    "PATCH /v1/loops/{id}",
    "POST /v1/schedules/{id}/pause",
    "POST /v1/schedules/{id}/resume",
    "POST /v1/schedules/{id}/token",
    "DELETE /v1/schedules/{id}",
    "POST /v1/hooks/{token}",
    "GET /v1/runs",
    "GET /v1/runs/{id}",
    "GET /v1/runs/{id}/events",
    "GET /v1/runs/{id}/steps",
    "GET /v1/runs/{id}/output",
    "POST /v1/runs/{id}/cancel",
    "GET /v1/runs/{id}/corpus",
    "GET /v1/runs/{id}/corpus/records",
    "POST /v1/runs/{id}/pause",
    "POST /v1/runs/{id}/resume",
    "PUT /v1/secrets/{name}",
    "GET /v1/secrets",
    "GET /v1/usage",
    "DELETE /v1/secrets/{name}",
    "GET /v1/openapi.json",
    "GET /v1/status",
    "GET /console",
    "GET /console/",
    "GET /console/{file}",
}
CONSOLE_ROUTES = {"GET /console", "GET /console/", "GET /console/{file}"}
PUBLIC_ROUTES = {"POST /v1/hooks/{token}", "GET /v1/openapi.json", *CONSOLE_ROUTES}
SQS_MAX_VISIBILITY = 43200


@cache
def template() -> dict[str, Any]:
    loaded, matches = decode(str(TEMPLATE))
    assert not matches, [str(m) for m in matches]
    assert loaded is not None
    return dict(loaded)


def resources(kind: str | None = None) -> dict[str, dict[str, Any]]:
    return {
        name: res for name, res in template()["Resources"].items() if kind is None or res["Type"] == kind
    }


def props(name: str) -> dict[str, Any]:
    result: dict[str, Any] = template()["Resources"][name]["Properties"]
    return result


def function_setting(name: str, key: str) -> Any:
    """A function's property, falling back to Globals the way SAM merges them (environment variables
    merge, the function's winning)."""
    if key == "Environment" and key in props(name):
        merged = dict(template()["Globals"]["Function"][key]["Variables"])
        return {"Variables": {**merged, **props(name)[key]["Variables"]}}
    if key in props(name):
        return props(name)[key]
    return template()["Globals"]["Function"][key]


def number(value: Any) -> int:
    """A literal number, or the largest value a referenced parameter allows."""
    if isinstance(value, dict) and set(value) == {"Ref"}:
        parameter = template()["Parameters"][value["Ref"]]
        return int(parameter.get("MaxValue", parameter["Default"]))
    return int(value)


def sqs_event(function: str) -> dict[str, Any]:
    events = [e for e in props(function)["Events"].values() if e["Type"] == "SQS"]
    assert len(events) == 1
    result: dict[str, Any] = events[0]["Properties"]
    return result


def http_routes() -> dict[str, dict[str, Any]]:
    """'METHOD /path' -> the HttpApi event's properties, over every function."""
    routes: dict[str, dict[str, Any]] = {}
    for name in resources("AWS::Serverless::Function"):
        for event in props(name).get("Events", {}).values():
            if event["Type"] == "HttpApi":
                key = f"{event['Properties']['Method'].upper()} {event['Properties']['Path']}"
                assert key not in routes, f"route {key} wired twice"
                routes[key] = event["Properties"]
    return routes


def walk(node: Any) -> Iterator[Any]:
    yield node
    if isinstance(node, dict):
        for value in node.values():
            yield from walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from walk(value)


def alarm_metrics(alarm: dict[str, Any]) -> list[dict[str, Any]]:
    """(Namespace, MetricName, Dimensions, Stat) of an alarm's metric or each metric of its math."""
    p = alarm["Properties"]
    if "MetricName" in p:
        return [{"Namespace": p["Namespace"], "MetricName": p["MetricName"],
                 "Dimensions": p.get("Dimensions", []), "Stat": p.get("Statistic")}]
    found = []
    for query in p["Metrics"]:
        if "MetricStat" in query:
            metric = query["MetricStat"]["Metric"]
            found.append({"Namespace": metric["Namespace"], "MetricName": metric["MetricName"],
                          "Dimensions": metric.get("Dimensions", []), "Stat": query["MetricStat"]["Stat"]})
    return found


def dashboard_metrics() -> list[list[Any]]:
    body = props("Dashboard")["DashboardBody"]["Fn::Sub"]
    # ${Resource.Attr} and ${AWS::Region} are filled in by CloudFormation; any string will do here.
    parsed = json.loads(re.sub(r"\$\{[^}]+\}", "x", body))
    rows: list[list[Any]] = []
    for widget in parsed["widgets"]:
        for row in widget["properties"].get("metrics", []):
            rows.append([part for part in row if not isinstance(part, dict)])
    return rows


# --- the queue -------------------------------------------------------------------------------------


def test_template_decodes_and_is_a_sam_template() -> None:
    assert template()["Transform"] == "AWS::Serverless-2016-10-31"
    assert template()["Globals"]["Function"]["Runtime"] == "python3.12"
    assert template()["Globals"]["Function"]["Tracing"] == "Active"


def test_queue_visibility_timeout_is_at_least_six_times_the_run_timeout() -> None:
    queue_arn = sqs_event("RunFunction")["Queue"]
    queue = queue_arn["Fn::GetAtt"][0]
    visibility = number(props(queue)["VisibilityTimeout"])
    run_timeout = number(function_setting("RunFunction", "Timeout"))
    assert visibility >= 6 * run_timeout, (visibility, run_timeout)
    assert visibility <= SQS_MAX_VISIBILITY


def test_dead_letter_queue_exists_and_the_redrive_policy_points_at_it() -> None:
    redrive = props("RunQueue")["RedrivePolicy"]
    dlq = redrive["deadLetterTargetArn"]["Fn::GetAtt"]
    assert dlq[1] == "Arn"
    assert template()["Resources"][dlq[0]]["Type"] == "AWS::SQS::Queue"
    assert 1 < int(redrive["maxReceiveCount"]) <= 10
    # A standard queue's DLQ keeps the original enqueue time: it must retain messages longer.
    assert int(props(dlq[0])["MessageRetentionPeriod"]) > int(props("RunQueue")["MessageRetentionPeriod"])
    for queue in ("RunQueue", dlq[0]):
        assert props(queue).get("SqsManagedSseEnabled") is True or "KmsMasterKeyId" in props(queue)


def test_run_function_reports_batch_item_failures_from_the_run_queue() -> None:
    event = sqs_event("RunFunction")
    assert event["Queue"] == {"Fn::GetAtt": ["RunQueue", "Arn"]}
    assert "ReportBatchItemFailures" in event["FunctionResponseTypes"]
    assert 1 <= number(event["BatchSize"]) <= 10
    assert number(function_setting("RunFunction", "Timeout")) <= 900
    # The poller never runs more copies than the function may.
    assert event["ScalingConfig"]["MaximumConcurrency"] == props("RunFunction")["ReservedConcurrentExecutions"]
    # A batch's runs execute at once: the function runs as many as a batch holds, and batches fill
    # within a window short beside a model's answer.
    variables = function_setting("RunFunction", "Environment")["Variables"]
    assert variables["KAIROS_RUN_CONCURRENCY_PER_INVOCATION"] == event["BatchSize"] == {"Ref": "RunBatchSize"}
    assert number(template()["Parameters"]["RunBatchSize"]["Default"]) == 10
    assert 0 < number(event["MaximumBatchingWindowInSeconds"]) <= 2


# --- alarms and dashboard --------------------------------------------------------------------------


def test_every_kairos_alarm_names_a_metric_the_code_emits() -> None:
    checked = 0
    for name, alarm in resources("AWS::CloudWatch::Alarm").items():
        for metric in alarm_metrics(alarm):
            if metric["Namespace"] != "Kairos":
                continue
            checked += 1
            assert metric["MetricName"] in METRIC_NAMES, f"{name} watches {metric['MetricName']}"
            # Powertools emits the default dimension set {service}; another set is another metric.
            assert metric["Dimensions"] == [{"Name": "service", "Value": "kairos"}], name
    assert checked >= 4


def test_every_kairos_dashboard_metric_is_one_the_code_emits() -> None:
    rows = [row for row in dashboard_metrics() if row[0] == "Kairos"]
    assert {row[1] for row in rows} <= METRIC_NAMES
    assert all(row[2:] == ["service", "kairos"] for row in rows)
    for wanted in ("FiresDispatched", "FiresSkipped", "FireLagSeconds", "Claims", "ClaimConflicts",
                   "LeasesLost", "Rescues", "RunSucceeded", "RunFailed"):
        assert wanted in {row[1] for row in rows}
    aws = {(row[0], row[1]) for row in dashboard_metrics()}
    assert ("AWS/SQS", "ApproximateNumberOfMessagesVisible") in aws
    assert ("AWS/Lambda", "Errors") in aws


def test_the_alarms_the_operations_issue_asks_for_exist() -> None:
    by_metric: dict[tuple[str, str], list[tuple[dict[str, Any], dict[str, Any]]]] = {}
    for alarm in resources("AWS::CloudWatch::Alarm").values():
        for metric in alarm_metrics(alarm):
            by_metric.setdefault((metric["Namespace"], metric["MetricName"]), []).append((alarm, metric))

    (dlq_alarm, dlq_metric), = by_metric[("AWS/SQS", "ApproximateNumberOfMessagesVisible")]
    assert dlq_metric["Dimensions"] == [
        {"Name": "QueueName", "Value": {"Fn::GetAtt": ["RunDeadLetterQueue", "QueueName"]}}
    ]
    assert dlq_alarm["Properties"]["Threshold"] == 0
    assert dlq_alarm["Properties"]["ComparisonOperator"] == "GreaterThanThreshold"

    tick_errors = [a for a, m in by_metric[("AWS/Lambda", "Errors")]
                   if m["Dimensions"] == [{"Name": "FunctionName", "Value": {"Ref": "TickFunction"}}]]
    assert len(tick_errors) == 1

    (lag_alarm, lag_metric), = by_metric[("Kairos", "FireLagSeconds")]
    assert lag_metric["Stat"] == "Maximum"
    assert lag_alarm["Properties"]["Threshold"] == 120

    (rescue_alarm, rescue_metric), = by_metric[("Kairos", "Rescues")]
    assert rescue_metric["Stat"] == "Sum"
    assert rescue_alarm["Properties"]["Threshold"] == 0

    (rate_alarm, _), = by_metric[("Kairos", "RunFailed")]
    assert rate_alarm is by_metric[("Kairos", "RunSucceeded")][0][0]
    expression = next(q["Expression"] for q in rate_alarm["Properties"]["Metrics"] if "Expression" in q)
    assert "failed" in expression and "succeeded" in expression
    assert 0 < rate_alarm["Properties"]["Threshold"] < 100


def test_alarms_notify_the_optional_topic() -> None:
    for name, alarm in resources("AWS::CloudWatch::Alarm").items():
        actions = alarm["Properties"]["AlarmActions"]
        assert actions == {"Fn::If": ["HasAlarmTopic", [{"Ref": "AlarmTopicArn"}], {"Ref": "AWS::NoValue"}]}, name


# --- the HTTP API ----------------------------------------------------------------------------------


def test_access_log_format_never_contains_the_raw_path() -> None:
    log_format = props("HttpApi")["AccessLogSettings"]["Format"]
    assert "$context.path" not in log_format
    # Nor any other variable that carries the path (the webhook token is in it).
    variables = re.findall(r"\$context\.[A-Za-z0-9_.]+", log_format)
    assert variables and not [v for v in variables if "path" in v.lower()]
    assert "$context.routeKey" in variables
    json.loads(log_format)  # one JSON object per request


def test_every_api_route_is_wired_to_the_api_function() -> None:
    assert set(http_routes()) == ROUTES
    for name in resources("AWS::Serverless::Function"):
        for event in props(name).get("Events", {}).values():
            if event["Type"] == "HttpApi":
                assert name == "ApiFunction"
                assert event["Properties"]["ApiId"] == {"Ref": "HttpApi"}


def test_the_template_wires_exactly_the_routes_the_api_serves() -> None:
    # A route the resolver serves but the template does not wire is unreachable once deployed; a
    # public route there must be public here too, and the other way round.
    api = pytest.importorskip("kairos.api.app")
    served = {spec.key: spec.public for spec in api.ROUTES}
    assert set(served) == set(http_routes())
    assert {key for key, public in served.items() if public} == PUBLIC_ROUTES


def test_hooks_route_has_no_authorizer_and_the_other_routes_do() -> None:
    auth = props("HttpApi")["Auth"]
    default = auth["DefaultAuthorizer"]
    jwt = auth["Authorizers"][default]["JwtConfiguration"]
    # AuthMode=external keeps the operator's issuer and audiences (Cognito's: test_template_modes.py).
    assert jwt["issuer"]["Fn::If"][0] == "UseCognito"
    assert jwt["issuer"]["Fn::If"][2] == {"Ref": "JwtIssuer"}
    assert jwt["audience"]["Fn::If"][2] == {"Ref": "JwtAudience"}
    for route, properties in http_routes().items():
        authorizer = properties.get("Auth", {}).get("Authorizer", default)
        if route in PUBLIC_ROUTES:
            assert authorizer == "NONE", route
        else:
            assert authorizer == default, route
    assert function_setting("ApiFunction", "Environment")["Variables"]["KAIROS_AUTH"] == "jwt"


# --- functions, layer, permissions -----------------------------------------------------------------


def test_each_handler_named_in_the_template_exists() -> None:
    functions = resources("AWS::Serverless::Function")
    assert {"TickFunction", "RunFunction", "ApiFunction", "MigrateFunction"} <= set(functions)
    for name in functions:
        module, _, attribute = props(name)["Handler"].rpartition(".")
        source = ROOT / props(name)["CodeUri"] / f"{module.replace('.', '/')}.py"
        assert source.is_file(), f"{name}: {source} is missing"
        tree = ast.parse(source.read_text(encoding="utf-8"))
        handlers = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == attribute]
        assert handlers, f"{name}: {source} defines no {attribute}()"
        assert [a.arg for a in handlers[0].args.args] == ["event", "context"]
        assert function_setting(name, "Layers") == [{"Ref": "CommonLayer"}]


def test_common_layer_is_built_from_the_package() -> None:
    layer = template()["Resources"]["CommonLayer"]
    assert layer["Metadata"]["BuildMethod"] == "makefile"  # layers/common/Makefile: adds the bytecode
    content = ROOT / layer["Properties"]["ContentUri"]
    makefile = (content / "Makefile").read_text(encoding="utf-8")
    assert "build-CommonLayer:" in makefile and "-r requirements.txt" in makefile and "compileall" in makefile
    assert "--python-version 3.12" in makefile and template()["Globals"]["Function"]["Runtime"] == "python3.12"
    assert (content / "requirements.txt").is_file()
    assert (content / "kairos" / "__init__.py").is_file()
    requirements = (content / "requirements.txt").read_text(encoding="utf-8")
    assert re.search(r"^tzdata==", requirements, re.MULTILINE)
    # Powertools' Tracer (Tracing: Active) imports aws-xray-sdk: without it no handler imports.
    assert re.search(r"^aws-lambda-powertools\[tracer\]==", requirements, re.MULTILINE)


def make_layer(target: str, out: Path, *options: str) -> str:
    """``make <target>`` in the layer's directory, as ``sam build`` runs it, with ``out`` as ARTIFACTS_DIR."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    content = ROOT / template()["Resources"]["CommonLayer"]["Properties"]["ContentUri"]
    done = subprocess.run(["make", "--no-print-directory", *options, target, f"ARTIFACTS_DIR={out}",
                           f"PYTHON={sys.executable}"], cwd=content, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_layer_build_copies_the_package_without_the_local_tooling(tmp_path: Path) -> None:
    """kairos/local (``kairos dev``, the local API Gateway, embedded PostgreSQL) never reaches Lambda."""
    # The full build (dry run: it would download wheels) copies the package through the same rule.
    plan = make_layer("build-CommonLayer", tmp_path, "--dry-run")
    assert f'rm -rf "{tmp_path}/python/kairos/local"' in plan and "-r requirements.txt" in plan
    assert plan.index("cp -R kairos") < plan.index(f'rm -rf "{tmp_path}/python/kairos/local"')

    make_layer("package", tmp_path)
    built = tmp_path / "python" / "kairos"
    assert (ROOT / "layers" / "common" / "kairos" / "local" / "__init__.py").is_file()
    assert not (built / "local").exists()
    assert (built / "cli.py").is_file() and sorted((built / "sql").glob("*.sql"))
    assert (built / "migrations" / "0001_init.sql").is_file()
    assert (built / "console" / "index.html").is_file() and (built / "console" / "app.js").is_file()
    tag = sys.implementation.cache_tag
    for source in built.rglob("*.py"):
        assert (source.parent / "__pycache__" / f"{source.stem}.{tag}.pyc").is_file(), source
    # What ships must import without it: only the kairos command reaches kairos.local, inside `dev`/`invoke`.
    for source in built.rglob("*.py"):
        tree = ast.parse(source.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n == "kairos.local" or n.startswith("kairos.local.") for n in names):
                assert source.name == "cli.py" and node not in tree.body, f"{source}:{node.lineno}"


def test_tick_runs_every_minute_with_a_small_reserved_concurrency() -> None:
    schedules = [e for e in props("TickFunction")["Events"].values() if e["Type"] == "Schedule"]
    assert [e["Properties"]["Schedule"] for e in schedules] == ["rate(1 minute)"]
    assert 2 <= props("TickFunction")["ReservedConcurrentExecutions"] <= 5
    assert number(props("TickFunction")["Timeout"]) <= 60
    assert props("TickFunction")["EventInvokeConfig"]["MaximumRetryAttempts"] == 0


def statements(function: str) -> list[dict[str, Any]]:
    """The IAM statements of a function's own role (every function names one; none uses SAM policies)."""
    role = props(function)["Role"]
    assert "Policies" not in props(function), f"{function}: SAM would add managed policies of its own"
    name = role["Fn::GetAtt"][0]
    assert template()["Resources"][name]["Type"] == "AWS::IAM::Role"
    found: list[dict[str, Any]] = []
    for policy in template()["Resources"][name]["Properties"]["Policies"]:
        for statement in policy["PolicyDocument"]["Statement"]:
            # A conditional statement (!If [condition, statement, AWS::NoValue]) is checked as granted.
            found.append(statement["Fn::If"][1] if "Fn::If" in statement else statement)
    return found


def actions(statement: dict[str, Any]) -> list[str]:
    return statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]


def granting(function: str, action: str) -> list[Any]:
    return [s["Resource"] for s in statements(function) if action in actions(s)]


def test_permissions_are_scoped_to_kairos_resources() -> None:
    run_queue = {"Fn::GetAtt": ["RunQueue", "Arn"]}
    # The created secret, or the existing database's (the inner If only reassures cfn-lint).
    database_secret = {"Fn::If": ["CreateDatabase", {"Ref": "DatabaseSecret"}, {"Fn::If": [
        "HasDatabaseSecretArn", {"Ref": "DatabaseSecretArn"},
        {"Fn::Sub": "arn:${AWS::Partition}:secretsmanager:${AWS::Region}:${AWS::AccountId}:secret:none"}]}]}
    functions = ("TickFunction", "RunFunction", "ApiFunction", "MigrateFunction")
    for function in functions:
        for statement in statements(function):
            assert statement["Effect"] == "Allow"
            assert not [a for a in actions(statement) if a == "*" or a.endswith(":*")], function
            if statement["Resource"] == "*":  # X-Ray and ListSecrets have no resource-level permissions
                assert set(actions(statement)) in ({"xray:PutTraceSegments", "xray:PutTelemetryRecords"},
                                                   {"secretsmanager:ListSecrets"}), function
        assert database_secret in granting(function, "secretsmanager:GetSecretValue"), function
        assert granting(function, "logs:PutLogEvents") == [{"Fn::GetAtt": [function.replace("Function", "LogGroup"),
                                                                           "Arn"]}], function
        assert granting(function, "sqs:SendMessage") in ([], [run_queue]), function
        # The only managed policy: VPC networking, attached only when the functions run in a VPC.
        role = template()["Resources"][props(function)["Role"]["Fn::GetAtt"][0]]["Properties"]
        (vpc,) = role["ManagedPolicyArns"]
        assert vpc["Fn::If"][0] == "InVpc" and vpc["Fn::If"][2] == {"Ref": "AWS::NoValue"}
    assert granting("TickFunction", "sqs:SendMessage") == [run_queue]
    assert granting("MigrateFunction", "sqs:SendMessage") == []
    assert granting("RunFunction", "sqs:ReceiveMessage") == [run_queue]
    assert all(granting(f, "sqs:ReceiveMessage") == [] for f in functions if f != "RunFunction")
    # Agent keys: only under the parameterised prefix, and only for the functions that read them.
    for function in ("RunFunction", "ApiFunction", "TickFunction"):  # the tick signs notify webhooks
        agent_secrets = [g for g in granting(function, "secretsmanager:GetSecretValue") if g != database_secret]
        assert len(agent_secrets) == 1, function
        assert agent_secrets[0]["Fn::Sub"].endswith(":secret:${AgentSecretPrefix}/*"), function
    # Owners' keys are written only by the API, only under the prefix; the run function reads them only.
    for action in ("secretsmanager:CreateSecret", "secretsmanager:PutSecretValue", "secretsmanager:DeleteSecret"):
        (resource,) = granting("ApiFunction", action)
        assert resource["Fn::Sub"].endswith(":secret:${AgentSecretPrefix}/*"), action
        assert all(granting(f, action) == [] for f in functions if f != "ApiFunction"), action
    assert granting("ApiFunction", "secretsmanager:ListSecrets") == ["*"]
    assert all(granting(f, "secretsmanager:ListSecrets") == [] for f in functions if f != "ApiFunction")
    assert granting("RunFunction", "bedrock:InvokeModel")
    assert all(granting(f, "bedrock:InvokeModel") == [] for f in functions if f != "RunFunction")
    # Corpus runs: only the run function reads the listed source buckets and writes the export bucket.
    assert granting("RunFunction", "s3:PutObject") == [{"Fn::Sub": "${ExportBucket.Arn}/exports/*"}]
    assert all(granting(f, "s3:PutObject") == [] and granting(f, "s3:ListBucket") == []
               for f in functions if f != "RunFunction")
    (sources,) = granting("RunFunction", "s3:ListBucket")
    assert sources["Fn::Split"][0] == ","
    export_bucket = props("ExportBucket")
    assert export_bucket["PublicAccessBlockConfiguration"]["RestrictPublicBuckets"] is True
    assert export_bucket["BucketEncryption"]["ServerSideEncryptionConfiguration"]
    assert export_bucket["LifecycleConfiguration"]["Rules"][0]["Status"] == "Enabled"


def test_migrations_run_at_deploy_through_the_custom_resource() -> None:
    (name, resource), = resources("Custom::KairosMigrations").items()
    properties = resource["Properties"]
    assert properties["ServiceToken"] == {"Fn::GetAtt": ["MigrateFunction", "Arn"]}
    # A property that changes with the code, so CloudFormation sends Update on every new layer.
    assert {"Ref": "CommonLayer"} in list(walk(properties))
    assert number(properties["ServiceTimeout"]) > number(props("MigrateFunction")["Timeout"])
    for function in ("TickFunction", "RunFunction", "ApiFunction"):
        depends = template()["Resources"][function].get("DependsOn")
        assert name == depends or name in (depends or []), f"{function} may start before the schema exists"


def test_functions_get_the_contract_environment() -> None:
    variables = template()["Globals"]["Function"]["Environment"]["Variables"]
    assert {
        "POWERTOOLS_SERVICE_NAME", "POWERTOOLS_METRICS_NAMESPACE", "DATABASE_SECRET_ARN", "RUN_QUEUE_URL",
        "KAIROS_PUBLIC_URL", "KAIROS_EGRESS_ALLOW", "KAIROS_AUTH", "DATABASE_PROXY_HOST",
        "KAIROS_SECRET_PREFIX", "KAIROS_SHARED_SECRETS",
    } <= set(variables)
    assert variables["KAIROS_SECRET_PREFIX"] == {"Ref": "AgentSecretPrefix"}
    assert variables["KAIROS_SHARED_SECRETS"] == {"Ref": "SharedSecrets"}
    assert variables["POWERTOOLS_SERVICE_NAME"] == "kairos"
    assert variables["POWERTOOLS_METRICS_NAMESPACE"] == "Kairos"
    assert variables["RUN_QUEUE_URL"] == {"Ref": "RunQueue"}
    assert variables["DATABASE_SECRET_ARN"] == {"Fn::If": ["CreateDatabase", {"Ref": "DatabaseSecret"},
                                                           {"Ref": "DatabaseSecretArn"}]}
    proxy = variables["DATABASE_PROXY_HOST"]["Fn::If"]
    assert proxy[:2] == ["CreateDatabase", {"Fn::GetAtt": ["DatabaseProxy", "Endpoint"]}]
    assert proxy[2]["Fn::If"][0] == "HasProxy"
    assert "DATABASE_URL" not in variables  # deployed code reads the secret


def test_the_console_signs_in_against_the_authorizers_issuer_and_reads_the_dlq() -> None:
    variables = props("ApiFunction")["Environment"]["Variables"]
    issuer = props("HttpApi")["Auth"]["Authorizers"]["KairosJwt"]["JwtConfiguration"]["issuer"]
    assert variables["KAIROS_CONSOLE_ISSUER"] == issuer
    assert variables["KAIROS_CONSOLE_CLIENT_ID"] == {
        "Fn::If": ["UseCognito", {"Ref": "UserPoolClient"}, {"Ref": "ConsoleClientId"}]}
    assert variables["KAIROS_CONSOLE_SCOPES"] == {"Ref": "ConsoleScopes"}
    assert variables["RUN_DLQ_URL"] == {"Ref": "RunDeadLetterQueue"}
    statements = props("ApiRole")["Policies"][0]["PolicyDocument"]["Statement"]
    [depth] = [s for s in statements if isinstance(s, dict) and s.get("Sid") == "DeadLetterDepth"]
    assert depth["Action"] == "sqs:GetQueueAttributes"
    assert depth["Resource"] == {"Fn::GetAtt": ["RunDeadLetterQueue", "Arn"]}


def test_retention_is_a_bounded_parameter_every_function_reads() -> None:
    parameter = template()["Parameters"]["RetentionDays"]
    assert (number(parameter["Default"]), number(parameter["MinValue"]), number(parameter["MaxValue"])) == (30, 1, 3650)
    variables = template()["Globals"]["Function"]["Environment"]["Variables"]
    assert variables["KAIROS_RETENTION_DAYS"] == {"Ref": "RetentionDays"}


def test_budgets_are_parameters_every_function_reads() -> None:
    parameters = template()["Parameters"]
    variables = template()["Globals"]["Function"]["Environment"]["Variables"]
    for name, variable, default in (("OwnerConcurrency", "KAIROS_OWNER_CONCURRENCY", 4),
                                    ("OwnerQueueMax", "KAIROS_OWNER_QUEUE_MAX", 200),
                                    ("OwnerDailyTokens", "KAIROS_OWNER_DAILY_TOKENS", 2_000_000),
                                    ("OwnerDailyCostUsd", "KAIROS_OWNER_DAILY_COST_USD", 50)):
        assert number(parameters[name]["Default"]) == default, name
        assert float(parameters[name]["MinValue"]) > 0, name
        assert variables[variable] == {"Ref": name}
    assert parameters["ModelPrices"]["Default"] == ""
    assert variables["KAIROS_MODEL_PRICES"] == {"Ref": "ModelPrices"}


def test_parameters_for_an_existing_database_and_optional_features() -> None:
    parameters = template()["Parameters"]
    # Every parameter has a default: `sam deploy --guided` with only Enter works (DatabaseMode=create,
    # AuthMode=cognito); the template's Rules ask for the existing database's secret and the external
    # issuer in the modes that use them.
    assert {k for k, v in parameters.items() if "Default" not in v} == set()
    assert (parameters["DatabaseMode"]["Default"], parameters["AuthMode"]["Default"]) == ("create", "cognito")
    rules = template()["Rules"]
    existing = {"Fn::Equals": [{"Ref": "DatabaseMode"}, "existing"]}
    assert rules["ExistingDatabaseNeedsItsSecret"]["RuleCondition"] == existing
    assert rules["ExternalAuthNeedsAnIssuer"]["RuleCondition"] == {"Fn::Equals": [{"Ref": "AuthMode"}, "external"]}
    for optional in ("SubnetIds", "SecurityGroupIds", "DatabaseProxyEndpoint", "PublicUrl", "EgressAllow",
                     "AlarmTopicArn", "SharedSecrets", "DatabaseSecretArn", "JwtIssuer", "JwtAudience"):
        assert parameters[optional]["Default"] == "", optional
    for other in ("LogRetentionDays", "RunReservedConcurrency", "AgentSecretPrefix"):
        assert "Default" in parameters[other]
    vpc = template()["Globals"]["Function"]["VpcConfig"]["Fn::If"]
    assert vpc[0] == "InVpc"
    assert vpc[1]["SubnetIds"]["Fn::If"] == ["CreateDatabase", [{"Ref": "PrivateSubnetA"}, {"Ref": "PrivateSubnetB"}],
                                             {"Ref": "SubnetIds"}]
    for log_group in resources("AWS::Logs::LogGroup").values():
        assert log_group["Properties"]["RetentionInDays"] == {"Ref": "LogRetentionDays"}


def test_outputs_name_the_urls_queues_and_dashboard() -> None:
    assert {"ApiUrl", "WebhookBaseUrl", "RunQueueUrl", "RunDeadLetterQueueUrl", "DashboardName"} <= set(
        template()["Outputs"]
    )


def test_samconfig_deploys_without_prompts() -> None:
    import tomllib

    config = tomllib.loads((ROOT / "samconfig.toml").read_text(encoding="utf-8"))
    deploy = config["default"]["deploy"]["parameters"]
    assert config["default"]["global"]["parameters"]["stack_name"] == "kairos"
    assert set(deploy["capabilities"].split()) == {"CAPABILITY_IAM", "CAPABILITY_AUTO_EXPAND"}
    assert deploy["resolve_s3"] is True
    overridden = {item.partition("=")[0] for item in deploy["parameter_overrides"]}
    required = {k for k, v in template()["Parameters"].items() if "Default" not in v}
    assert required <= overridden
    assert overridden <= set(template()["Parameters"])


# --- sample events ---------------------------------------------------------------------------------


def load_event(name: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads((EVENTS / name).read_text(encoding="utf-8"))
    return result


def http_event_files() -> list[str]:
    return sorted(p.name for p in EVENTS.glob("api_*.json"))


def test_every_event_file_is_json() -> None:
    files = sorted(EVENTS.glob("*.json"))
    assert len(files) >= len(ROUTES) + 3
    for path in files:
        assert isinstance(json.loads(path.read_text(encoding="utf-8")), dict), path.name


@pytest.mark.parametrize("name", http_event_files())
def test_http_event_has_the_api_gateway_v2_shape(name: str) -> None:
    event = load_event(name)
    assert event["version"] == "2.0"
    route = event["routeKey"]
    assert route in ROUTES, f"{name}: {route} is not a route of the template"
    method, _, pattern = route.partition(" ")
    context = event["requestContext"]
    assert context["routeKey"] == route
    assert context["http"]["method"] == method
    assert context["http"]["path"] == event["rawPath"]
    names = re.findall(r"\{(\w+)\}", pattern)
    match = re.fullmatch(re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^/]+)", re.escape(pattern)), event["rawPath"])
    assert match, f"{name}: rawPath does not match {pattern}"
    assert event.get("pathParameters", {}) == {k: match[k] for k in names}
    assert all(k == k.lower() for k in event["headers"]), "API Gateway lowercases header names"
    query = event.get("queryStringParameters", {})
    assert event["rawQueryString"] == "&".join(f"{k}={v}" for k, v in query.items())
    if "body" in event:
        assert isinstance(event["body"], str) and event["isBase64Encoded"] is False
        json.loads(event["body"])
    if route in PUBLIC_ROUTES:
        assert "authorizer" not in context
    else:
        assert context["authorizer"]["jwt"]["claims"]["sub"]


def test_every_route_has_a_sample_event() -> None:
    assert {load_event(name)["routeKey"] for name in http_event_files()} == ROUTES


def test_hook_event_carries_an_idempotency_key() -> None:
    event = load_event("api_hook.json")
    assert event["routeKey"] == "POST /v1/hooks/{token}"
    assert event["headers"]["idempotency-key"]
    assert event["pathParameters"]["token"] in event["rawPath"]


def test_run_event_is_an_sqs_batch_of_run_ids() -> None:
    records = load_event("run_sqs.json")["Records"]
    assert len(records) == 2
    assert len({r["messageId"] for r in records}) == 2
    for record in records:
        assert record["eventSource"] == "aws:sqs"
        body = json.loads(record["body"])
        assert set(body) == {"run_id"}
        uuid.UUID(body["run_id"])
        assert record["md5OfBody"] == hashlib.md5(record["body"].encode()).hexdigest()
        assert record["attributes"]["ApproximateReceiveCount"] == "1"


def test_tick_event_is_an_eventbridge_scheduled_event() -> None:
    event = load_event("tick.json")
    assert event["detail-type"] == "Scheduled Event"
    assert event["source"] == "aws.events"
    assert event["detail"] == {}
    assert event["resources"] and event["resources"][0].startswith("arn:aws:events:")


def test_migrate_event_is_a_custom_resource_create_for_the_template_resource() -> None:
    event = load_event("migrate_create.json")
    (logical_id, resource), = resources("Custom::KairosMigrations").items()
    assert event["RequestType"] == "Create"
    assert event["ResourceType"] == resource["Type"]
    assert event["LogicalResourceId"] == logical_id
    for key in ("ResponseURL", "StackId", "RequestId"):
        assert event[key]
    assert "ServiceToken" in event["ResourceProperties"]
    assert "PhysicalResourceId" not in event  # CloudFormation sends it only after Create


# --- the built layer (CI runs `sam build` before pytest) -------------------------------------------


def test_built_layer_carries_the_package_data_and_dependencies() -> None:
    build = ROOT / os.environ.get("KAIROS_SAM_BUILD_DIR", ".aws-sam/build")
    layer = build / "CommonLayer" / "python"
    if not layer.is_dir():
        pytest.skip(f"no sam build output in {build}")
    assert sorted((layer / "kairos" / "sql").glob("*.sql")), "layer has no named queries"
    assert (layer / "kairos" / "migrations" / "0001_init.sql").is_file()
    assert (layer / "kairos" / "console" / "index.html").is_file(), "the console's files are not in the layer"
    assert not (layer / "kairos" / "local").exists(), "the local tooling ships in the layer"
    for dependency in ("tzdata", "psycopg", "psycopg_binary", "psycopg_pool", "pydantic",
                       "aws_lambda_powertools", "aws_xray_sdk"):
        assert (layer / dependency).is_dir(), f"layer lacks {dependency}"
    # /opt is read-only on Lambda: without shipped bytecode every cold start compiles what it imports.
    for package in ("kairos", "botocore", "psycopg", "pydantic", "aws_lambda_powertools"):
        sources = {p.stem for p in (layer / package).glob("*.py")}
        compiled = {p.name.split(".")[0] for p in (layer / package / "__pycache__").glob("*.cpython-312.pyc")}
        assert sources and sources <= compiled, f"{package}: modules without bytecode: {sorted(sources - compiled)}"
