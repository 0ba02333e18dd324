"""The agent JSON's strict model (DESIGN.md "The run"), for ``kairos.conversations.validate_agent``.

Role: the one pydantic model of an agent config: declared fields only, secrets only as references
(``env:NAME`` or a Secrets Manager ARN; whose they may be is ``kairos.secrets.check``'s rule),
``base_url`` an http(s) URL without credentials.

Kept apart from ``kairos.conversations`` so that importing conversations (which the tick and the run
function do on every cold start) does not import pydantic; only code that validates an agent — the
API, and a ``fresh`` run creating its conversation — imports this module.

Must not: hold anything but the model (the rules on top of it live in ``validate_agent``).
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, field_validator
from pydantic_core import PydanticCustomError

from kairos import secrets


class AgentConfig(BaseModel):
    """The agent JSON of DESIGN.md "The run"; extra fields are refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    executor: Literal["openai", "bedrock", "http", "echo"]
    model: StrictStr | None = Field(default=None, min_length=1, max_length=200)
    system: StrictStr | None = Field(default=None, max_length=32_768)
    base_url: StrictStr | None = Field(default=None, max_length=2_048)
    api_key_secret: StrictStr | None = Field(default=None, max_length=2_048)
    max_tokens: StrictInt | None = Field(default=None, ge=1, le=8_192)
    # Bounded model input (DESIGN.md "The run"): default 16,000 when unset (kairos.executors.base).
    max_input_tokens: StrictInt | None = Field(default=None, ge=1, le=100_000)

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

    @field_validator("api_key_secret")
    @classmethod
    def _reference(cls, value: str | None) -> str | None:
        if value is not None and not secrets.is_reference(value):
            raise PydanticCustomError("secret_reference", secrets.HINT)
        return value
