"""What each deployment mode creates, read from the template as CloudFormation would create it.

The template is translated by samtranslator (the SAM transform) and its conditions settled for each
choice of DatabaseMode, AuthMode, NatGateway and BedrockEndpoint (``tests.support.sam``). The default
(``sam deploy --guided`` answering only Enter) must give a working system: the functions in the
stack's private subnets, the AWS services they call reachable through VPC endpoints, no NAT gateway,
Aurora behind RDS Proxy with its secret, and a Cognito user pool as the JWT issuer. The existing mode
must be today's stack: no network, database or user pool of its own.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.sam import deployed

SECRET = "arn:aws:secretsmanager:us-east-1:123456789012:secret:kairos-database-AbCdEf"
EXISTING = {"DatabaseMode": "existing", "DatabaseSecretArn": SECRET}
EXTERNAL = {"AuthMode": "external", "JwtIssuer": "https://auth.example.com", "JwtAudience": "kairos"}
FUNCTIONS = {"TickFunction", "RunFunction", "ApiFunction", "MigrateFunction"}
PRIVATE_SUBNETS = [{"Ref": "PrivateSubnetA"}, {"Ref": "PrivateSubnetB"}]
INTERFACE_SERVICES = {"sqs", "secretsmanager", "logs", "monitoring"}
CREATED_PREFIXES = ("AWS::EC2::", "AWS::RDS::", "AWS::Cognito::", "AWS::SecretsManager::")
# The stack as it was before the modes existed (DatabaseMode=existing, AuthMode=external).
EXISTING_TYPES = {
    "AWS::Lambda::Permission", "AWS::CloudWatch::Alarm", "AWS::Logs::LogGroup", "AWS::IAM::Role",
    "AWS::Lambda::Function", "AWS::SQS::Queue", "AWS::CloudWatch::Dashboard", "AWS::ApiGatewayV2::Api",
    "AWS::Lambda::LayerVersion", "Custom::KairosMigrations", "AWS::Events::Rule", "AWS::SQS::QueuePolicy",
    "AWS::Lambda::EventInvokeConfig", "AWS::ApiGatewayV2::Stage", "AWS::Lambda::EventSourceMapping",
    "AWS::S3::Bucket", "AWS::S3::BucketPolicy",  # corpus exports (both modes)
    "AWS::Lambda::Version", "AWS::Lambda::Alias",  # SnapStart: published versions behind the alias `live`
}


def of_type(stack: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    return {name: r.get("Properties", {}) for name, r in stack["Resources"].items() if r["Type"] == kind}


def functions(stack: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found = of_type(stack, "AWS::Lambda::Function")
    assert set(found) == FUNCTIONS
    return found


def environment(stack: dict[str, Any], function: str) -> dict[str, Any]:
    result: dict[str, Any] = functions(stack)[function]["Environment"]["Variables"]
    return result


def authorizer(stack: dict[str, Any]) -> dict[str, Any]:
    schemes = stack["Resources"]["HttpApi"]["Properties"]["Body"]["components"]["securitySchemes"]
    result: dict[str, Any] = schemes["KairosJwt"]["x-amazon-apigateway-authorizer"]["jwtConfiguration"]
    return result


def rules_of(stack: dict[str, Any], group: str) -> list[dict[str, Any]]:
    """Ingress and egress rules of a security group, inline or as separate resources."""
    props = stack["Resources"][group]["Properties"]
    rules = [{"Direction": "in", **r} for r in props.get("SecurityGroupIngress", [])]
    rules += [{"Direction": "out", **r} for r in props.get("SecurityGroupEgress", [])]
    for kind, direction in (("AWS::EC2::SecurityGroupIngress", "in"), ("AWS::EC2::SecurityGroupEgress", "out")):
        rules += [{"Direction": direction, **r} for r in of_type(stack, kind).values()
                  if r["GroupId"] == {"Ref": group}]
    return rules


def routes_to_internet(stack: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in of_type(stack, "AWS::EC2::Route").values() if r.get("DestinationCidrBlock") == "0.0.0.0/0"]


def endpoint_service(endpoint: dict[str, Any]) -> str:
    return str(endpoint["ServiceName"]["Fn::Sub"]).removeprefix("com.amazonaws.${AWS::Region}.")


# --- DatabaseMode=create (the default) -------------------------------------------------------------


def test_by_default_every_function_runs_in_the_stacks_private_subnets() -> None:
    stack = deployed()
    for name, function in functions(stack).items():
        assert function["VpcConfig"] == {"SubnetIds": PRIVATE_SUBNETS,
                                         "SecurityGroupIds": [{"Ref": "FunctionSecurityGroup"}]}, name
    subnets = of_type(stack, "AWS::EC2::Subnet")
    assert set(subnets) == {"PrivateSubnetA", "PrivateSubnetB"}
    assert [s["AvailabilityZone"]["Fn::Select"][0] for s in subnets.values()] == [0, 1]  # two AZs
    assert all(s["MapPublicIpOnLaunch"] is False and s["VpcId"] == {"Ref": "Vpc"} for s in subnets.values())
    # The functions' roles may create and remove their network interfaces.
    for role in of_type(stack, "AWS::IAM::Role").values():
        if role["AssumeRolePolicyDocument"]["Statement"][0]["Principal"] == {"Service": "lambda.amazonaws.com"}:
            (policy,) = role["ManagedPolicyArns"]
            assert policy["Fn::Sub"].endswith(":policy/service-role/AWSLambdaVPCAccessExecutionRole")


def test_by_default_there_is_no_nat_gateway_and_no_way_to_the_internet() -> None:
    stack = deployed()
    types = {r["Type"] for r in stack["Resources"].values()}
    assert not types & {"AWS::EC2::NatGateway", "AWS::EC2::InternetGateway", "AWS::EC2::EIP"}
    assert routes_to_internet(stack) == []


def test_the_services_the_functions_call_have_vpc_endpoints_in_both_subnets() -> None:
    stack = deployed()
    vpc = stack["Resources"]["Vpc"]["Properties"]
    assert vpc["EnableDnsSupport"] is True and vpc["EnableDnsHostnames"] is True  # private DNS names
    endpoints = of_type(stack, "AWS::EC2::VPCEndpoint")
    interface = {endpoint_service(e): e for e in endpoints.values() if e["VpcEndpointType"] == "Interface"}
    assert set(interface) == INTERFACE_SERVICES | {"bedrock-runtime"}
    for service, endpoint in interface.items():
        assert endpoint["SubnetIds"] == PRIVATE_SUBNETS, service
        assert endpoint["PrivateDnsEnabled"] is True, service
        assert endpoint["SecurityGroupIds"] == [{"Ref": "EndpointSecurityGroup"}], service
    # The migrator answers CloudFormation through a presigned S3 URL: the (free) gateway endpoint.
    (gateway,) = [e for e in endpoints.values() if e["VpcEndpointType"] == "Gateway"]
    assert endpoint_service(gateway) == "s3"
    assert gateway["RouteTableIds"] == [{"Ref": "PrivateRouteTable"}]
    associations = of_type(stack, "AWS::EC2::SubnetRouteTableAssociation").values()
    assert sorted(a["SubnetId"]["Ref"] for a in associations if a["RouteTableId"] == {"Ref": "PrivateRouteTable"}) \
        == ["PrivateSubnetA", "PrivateSubnetB"]


def test_the_bedrock_endpoint_can_be_left_out() -> None:
    endpoints = of_type(deployed(BedrockEndpoint="false"), "AWS::EC2::VPCEndpoint").values()
    assert {endpoint_service(e) for e in endpoints if e["VpcEndpointType"] == "Interface"} == INTERFACE_SERVICES


def test_nat_gateway_single_gives_the_private_subnets_one_way_out() -> None:
    stack = deployed(NatGateway="single")
    (nat_name, nat), = of_type(stack, "AWS::EC2::NatGateway").items()
    assert nat["SubnetId"] == {"Ref": "PublicSubnet"}
    (gateway,) = of_type(stack, "AWS::EC2::InternetGateway")
    by_table = {r["RouteTableId"]["Ref"]: r for r in routes_to_internet(stack)}
    assert set(by_table) == {"PrivateRouteTable", "PublicRouteTable"}
    assert by_table["PrivateRouteTable"]["NatGatewayId"] == {"Ref": nat_name}
    assert by_table["PublicRouteTable"]["GatewayId"] == {"Ref": gateway}
    # The functions stay in the private subnets.
    assert all(f["VpcConfig"]["SubnetIds"] == PRIVATE_SUBNETS for f in functions(stack).values())


def test_aurora_serverless_v2_sits_behind_rds_proxy_with_tls_required() -> None:
    stack = deployed()
    (cluster,) = of_type(stack, "AWS::RDS::DBCluster").values()
    assert cluster["Engine"] == "aurora-postgresql"
    assert cluster["EngineVersion"].split(".")[0] in ("15", "16")
    assert cluster["ServerlessV2ScalingConfiguration"] == {"MinCapacity": 0.5,
                                                           "MaxCapacity": {"Ref": "DatabaseMaxCapacity"}}
    assert cluster["StorageEncrypted"] is True
    assert cluster["VpcSecurityGroupIds"] == [{"Ref": "ClusterSecurityGroup"}]
    assert stack["Resources"]["DatabaseCluster"]["DeletionPolicy"] == "Snapshot"
    (instance,) = of_type(stack, "AWS::RDS::DBInstance").values()
    assert instance["DBInstanceClass"] == "db.serverless"
    assert instance["DBClusterIdentifier"] == {"Ref": "DatabaseCluster"}
    assert instance["PubliclyAccessible"] is False
    (proxy,) = of_type(stack, "AWS::RDS::DBProxy").values()
    assert proxy["RequireTLS"] is True and proxy["EngineFamily"] == "POSTGRESQL"
    assert proxy["Auth"] == [{"AuthScheme": "SECRETS", "SecretArn": {"Ref": "DatabaseSecret"}, "IAMAuth": "DISABLED"}]
    assert proxy["VpcSubnetIds"] == PRIVATE_SUBNETS
    assert proxy["VpcSecurityGroupIds"] == [{"Ref": "ProxySecurityGroup"}]
    (target,) = of_type(stack, "AWS::RDS::DBProxyTargetGroup").values()
    assert target["DBProxyName"] == {"Ref": "DatabaseProxy"}
    assert target["DBClusterIdentifiers"] == [{"Ref": "DatabaseCluster"}]
    # The proxy's role reads the database secret and nothing else.
    role = stack["Resources"][proxy["RoleArn"]["Fn::GetAtt"][0]]["Properties"]
    (statement,) = role["Policies"][0]["PolicyDocument"]["Statement"]
    assert (statement["Action"], statement["Resource"]) == ("secretsmanager:GetSecretValue", {"Ref": "DatabaseSecret"})
    for name in FUNCTIONS:
        variables = environment(stack, name)
        assert variables["DATABASE_PROXY_HOST"] == {"Fn::GetAtt": ["DatabaseProxy", "Endpoint"]}, name
        assert variables["DATABASE_SECRET_ARN"] == {"Ref": "DatabaseSecret"}, name


def test_the_created_secret_is_the_clusters_and_every_function_may_read_it() -> None:
    stack = deployed()
    secret = stack["Resources"]["DatabaseSecret"]["Properties"]["GenerateSecretString"]
    assert secret["GenerateStringKey"] == "password"
    assert '"dbname": "kairos"' in secret["SecretStringTemplate"]  # the RDS shape kairos.settings reads
    cluster = stack["Resources"]["DatabaseCluster"]["Properties"]
    assert cluster["DatabaseName"] == "kairos"
    assert "${DatabaseSecret}:SecretString:password" in cluster["MasterUserPassword"]["Fn::Sub"]
    (attachment,) = of_type(stack, "AWS::SecretsManager::SecretTargetAttachment").values()
    assert attachment["TargetId"] == {"Ref": "DatabaseCluster"}  # adds host and port to the secret
    # The secret is not under the owners' prefix, so no agent key reference can name it.
    assert "Name" not in stack["Resources"]["DatabaseSecret"]["Properties"]
    for name, function in functions(stack).items():
        role = stack["Resources"][function["Role"]["Fn::GetAtt"][0]]["Properties"]
        statements = [s for p in role["Policies"] for s in p["PolicyDocument"]["Statement"]]
        assert {"Ref": "DatabaseSecret"} in [s["Resource"] for s in statements
                                             if s["Action"] == "secretsmanager:GetSecretValue"], name


def test_only_the_proxy_reaches_the_cluster_and_only_the_functions_reach_the_proxy() -> None:
    stack = deployed()
    postgres = {"IpProtocol": "tcp", "FromPort": 5432, "ToPort": 5432}

    def inbound(group: str) -> list[dict[str, Any]]:
        return [r for r in rules_of(stack, group) if r["Direction"] == "in"]

    (cluster_in,) = inbound("ClusterSecurityGroup")
    assert cluster_in.items() >= {**postgres, "SourceSecurityGroupId": {"Ref": "ProxySecurityGroup"}}.items()
    (proxy_in,) = inbound("ProxySecurityGroup")
    assert proxy_in.items() >= {**postgres, "SourceSecurityGroupId": {"Ref": "FunctionSecurityGroup"}}.items()
    # The endpoints answer the functions and the proxy (which reads the database secret), on 443.
    assert sorted((r["FromPort"], r["SourceSecurityGroupId"]["Ref"]) for r in inbound("EndpointSecurityGroup")) \
        == [(443, "FunctionSecurityGroup"), (443, "ProxySecurityGroup")]
    assert inbound("FunctionSecurityGroup") == []
    outbound = [r for r in rules_of(stack, "FunctionSecurityGroup") if r["Direction"] == "out"]
    assert sorted(r["FromPort"] for r in outbound) == [443, 5432]
    (to_database,) = [r for r in outbound if r["FromPort"] == 5432]
    assert to_database["DestinationSecurityGroupId"] == {"Ref": "ProxySecurityGroup"}
    proxy_out = {r["FromPort"]: r for r in rules_of(stack, "ProxySecurityGroup") if r["Direction"] == "out"}
    assert set(proxy_out) == {443, 5432}
    to_cluster = {**postgres, "DestinationSecurityGroupId": {"Ref": "ClusterSecurityGroup"}}
    assert proxy_out[5432].items() >= to_cluster.items()
    assert proxy_out[443]["DestinationSecurityGroupId"] == {"Ref": "EndpointSecurityGroup"}
    # The cluster and the endpoints open no connection of their own (a rule that matches nothing).
    for group in ("ClusterSecurityGroup", "EndpointSecurityGroup"):
        (out,) = [r for r in rules_of(stack, group) if r["Direction"] == "out"]
        assert out["CidrIp"] == "127.0.0.1/32", group


def test_migrations_wait_for_the_database_its_proxy_and_the_endpoints() -> None:
    stack = deployed()
    (migrations,) = of_type(stack, "Custom::KairosMigrations").values()
    waits_for = {part["Ref"] for part in migrations["Database"]["Fn::Join"][1]}
    assert {"DatabaseProxyTargetGroup", "DatabaseInstance", "DatabaseSecretAttachment", "SecretsManagerEndpoint",
            "S3Endpoint"} <= waits_for
    assert deployed(**EXISTING)["Resources"]["SchemaMigrations"]["Properties"]["Database"] == "existing"
    # The target group completes only with a healthy target: the proxy must reach its secret then.
    assert {"DatabaseInstance", "SecretsManagerEndpoint", "ProxyToEndpoints", "EndpointsFromProxy"} <= set(
        stack["Resources"]["DatabaseProxyTargetGroup"]["DependsOn"])


# --- AuthMode ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("database", [{}, EXISTING], ids=["create", "existing"])
def test_cognito_issues_the_apis_tokens_by_default(database: dict[str, str]) -> None:
    stack = deployed(**database)
    (client,) = of_type(stack, "AWS::Cognito::UserPoolClient").values()
    assert client["UserPoolId"] == {"Ref": "UserPool"}
    assert client["GenerateSecret"] is False  # a public client: authorization code with PKCE
    assert client["AllowedOAuthFlows"] == ["code"] and client["AllowedOAuthFlowsUserPoolClient"] is True
    assert client["CallbackURLs"] == {"Ref": "CallbackUrls"}
    assert len(of_type(stack, "AWS::Cognito::UserPoolDomain")) == 1
    assert authorizer(stack) == {
        "issuer": {"Fn::Sub": "https://cognito-idp.${AWS::Region}.${AWS::URLSuffix}/${UserPool}"},
        "audience": [{"Ref": "UserPoolClient"}],
    }
    cognito_outputs = {"UserPoolId", "UserPoolClientId", "SignInUrl"}
    assert cognito_outputs <= set(stack["Outputs"])
    assert not cognito_outputs & set(deployed(**database, **EXTERNAL)["Outputs"])


@pytest.mark.parametrize("database", [{}, EXISTING], ids=["create", "existing"])
def test_an_external_issuer_makes_no_user_pool(database: dict[str, str]) -> None:
    stack = deployed(**database, **EXTERNAL)
    assert not [r for r in stack["Resources"].values() if r["Type"].startswith("AWS::Cognito::")]
    assert authorizer(stack) == {"issuer": {"Ref": "JwtIssuer"}, "audience": {"Ref": "JwtAudience"}}


# --- DatabaseMode=existing ----------------------------------------------------------------------------


def test_the_existing_mode_is_the_stack_it_was() -> None:
    stack = deployed(**EXISTING, **EXTERNAL)
    assert {r["Type"] for r in stack["Resources"].values()} == EXISTING_TYPES
    assert not [r for r in stack["Resources"].values() if r["Type"].startswith(CREATED_PREFIXES)]
    for name, function in functions(stack).items():
        assert "VpcConfig" not in function, name
        variables = environment(stack, name)
        assert variables["DATABASE_SECRET_ARN"] == {"Ref": "DatabaseSecretArn"}, name
        assert "DATABASE_PROXY_HOST" not in variables, name
        role = stack["Resources"][function["Role"]["Fn::GetAtt"][0]]["Properties"]
        assert "ManagedPolicyArns" not in role or role["ManagedPolicyArns"] == [], name


def test_the_existing_mode_takes_the_operators_subnets_and_proxy() -> None:
    stack = deployed(**EXISTING, **EXTERNAL, SubnetIds="subnet-1,subnet-2", SecurityGroupIds="sg-1",
                     DatabaseProxyEndpoint="kairos.proxy-x.us-east-1.rds.amazonaws.com")
    assert not [r for r in stack["Resources"].values() if r["Type"].startswith(CREATED_PREFIXES)]
    for name, function in functions(stack).items():
        assert function["VpcConfig"] == {"SubnetIds": {"Ref": "SubnetIds"},
                                         "SecurityGroupIds": {"Ref": "SecurityGroupIds"}}, name
        assert environment(stack, name)["DATABASE_PROXY_HOST"] == {"Ref": "DatabaseProxyEndpoint"}, name
