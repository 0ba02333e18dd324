"""Agents: the agent JSON's strict model and its validation (docs/api.md "API"), one home.

Role: ``AgentConfig`` is the one pydantic model of an agent config: declared fields only, secrets only
as references (``env:NAME`` or a Secrets Manager ARN), ``base_url`` an http(s) URL without
credentials. ``validate`` adds what the shape cannot say: what each executor needs
(``EXECUTOR_NEEDS``) and whether the owner may send the referenced secret to ``base_url``
(``kairos.secrets.check``), and reports every problem at once.

Built on pydantic; every function imports it at its module's top and warms it before its SnapStart
snapshot, so validation costs a restored function no import.

Must not: log or return a secret; accept a literal key.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
)
from pydantic_core import PydanticCustomError

from kairos import limits, runtime, secrets
from kairos.errors import REQUIRED, TYPE, FieldError, ValidationFailed, from_validation_error
from kairos.executors.base import MAX_STEPS_CAP
from kairos.executors.catalog import CATALOG, TOOL_EXECUTORS
from kairos.executors.catalog import EXECUTOR_NEEDS as EXECUTOR_NEEDS

# EXECUTOR_NEEDS (from kairos.executors.catalog): what each executor cannot work without, checked
# after the shape, so a model learns it at once instead of at the first fire.
if TYPE_CHECKING:
    ExecutorName = str
else:
    # The catalog's names as a Literal, in its order (pydantic's literal_error lists them so).
    ExecutorName = Literal[tuple(CATALOG)]


def _reference(value: str) -> str:
    if not secrets.is_reference(value):
        raise PydanticCustomError("secret_reference", secrets.HINT)
    return value


# A secret as a model field: a reference (``env:NAME`` or a Secrets Manager ARN), never a literal key.
# Agents' keys, signing secrets and notify secrets all take this one type.
SecretReference = Annotated[StrictStr, Field(max_length=2_048), AfterValidator(_reference)]


class RunLimits(BaseModel):
    """What one run may use (docs/api.md "Limits"): each a whole number from 1 to the server's cap
    (``KAIROS_MAX_*``, checked by ``kairos.limits.cap_problems``); unset means the default."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    runtime_seconds: StrictInt | None = Field(default=None, ge=1, description="default 600")
    max_attempts: StrictInt | None = Field(default=None, ge=1, description="default 3")
    max_steps: StrictInt | None = Field(default=None, ge=1, description="a tool loop's model turns; default 8")


class AgentConfig(BaseModel):
    """The agent JSON (docs/api.md "API"); extra fields are refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    executor: ExecutorName
    model: StrictStr | None = Field(default=None, min_length=1, max_length=200)
    system: StrictStr | None = Field(default=None, max_length=32_768)
    base_url: StrictStr | None = Field(default=None, max_length=2_048)
    api_key_secret: SecretReference | None = None
    max_tokens: StrictInt | None = Field(default=None, ge=1, le=8_192)
    # Bounded model input (docs/api.md "API"): default 16,000 when unset (kairos.executors.base).
    max_input_tokens: StrictInt | None = Field(default=None, ge=1, le=100_000)
    # The tool loop (docs/api.md "Agents that act"): openai and bedrock only.
    tools: list[Literal["schedules", "http"]] | None = Field(default=None, max_length=2)
    max_steps: StrictInt | None = Field(default=None, ge=1, le=MAX_STEPS_CAP)
    approval: Literal["never", "mutations", "always"] | None = None
    # openai, bedrock: stream the answer (default); false for a server that refuses the stream fields.
    stream: StrictBool | None = None
    # A conversation's runs (chat turns, and a schedule's when it sets none): kairos.limits.
    limits: RunLimits | None = None

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in value):
            raise PydanticCustomError("url", "give an http(s) URL such as https://host/v1")
        if "@" in parts.netloc:
            raise PydanticCustomError("url", "credentials must not be part of the URL; use api_key_secret")
        return value


def validate(raw: object, *, owner: str | None, field: str = "agent") -> dict[str, Any]:
    """The agent JSON, normalized (unset fields dropped); ``ValidationFailed`` naming ``agent.<name>``.

    With an ``owner``, its ``api_key_secret`` must also be one that owner may send to the agent's
    ``base_url`` (rules ``secret_reference`` / ``secret_audience``). ``owner=None`` checks the shape
    only: for a run's own thread, whose agent was checked when written and is checked again by the
    executor before every call.
    """
    if not isinstance(raw, Mapping):
        raise ValidationFailed([FieldError(field, TYPE, "give the agent as a JSON object")])
    problems: list[FieldError] = []
    config: AgentConfig | None = None
    try:
        config = AgentConfig.model_validate(dict(raw))
    except ValidationError as error:
        problems.extend(from_validation_error(error, prefix=field))
    executor = raw.get("executor")
    if isinstance(executor, str):
        for name in EXECUTOR_NEEDS.get(executor, ()):
            if raw.get(name) is None:
                problems.append(FieldError(f"{field}.{name}", REQUIRED, f"the {executor} executor needs {name}"))
    if config is not None and config.tools and config.executor not in TOOL_EXECUTORS:
        problems.append(FieldError(f"{field}.tools", "not_for_executor",
                                   "tools need a model that calls them: the openai or bedrock executor"))
    if executor == "bedrock" and owner is not None and os.environ.get("KAIROS_LOCAL") == "1":
        # `kairos dev` has no Bedrock (moto has no Converse): refused here rather than failing each run.
        problems.append(FieldError(f"{field}.executor", "not_available_locally",
                                   "Bedrock is not available in the local stack (kairos dev): use the openai "
                                   "executor with any OpenAI-compatible endpoint, or echo, or deploy to AWS"))
    if config is not None and config.tools and len(set(config.tools)) != len(config.tools):
        problems.append(FieldError(f"{field}.tools", "unique", "name each tool once"))
    if config is not None and owner is not None and config.api_key_secret is not None:
        try:
            secrets.check(config.api_key_secret, owner=owner, audience=config.base_url)
        except secrets.Refused as refused:
            problems.append(secrets.field_error(refused, f"{field}.api_key_secret"))
    if config is not None and config.limits is not None:
        problems.extend(limits.cap_problems(config.limits.model_dump(exclude_none=True), prefix=f"{field}.limits",
                                            settings=runtime.settings()))
    if problems or config is None:
        raise ValidationFailed(problems)
    return config.model_dump(exclude_none=True)
