"""Typed request fields of the OpenAI surface beyond plain text generation:
tools, tool_choice, response_format, logit_bias, and the fields the gateway
knows but refuses.

These models are the contract (they are the OpenAPI document); vLLM's own
request models validate the same values again when the gateway hands them
to vLLM's tool parser and constraint builders (gateway.serving.turn.parsing).
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gateway.serving.turn.fields import NAME_PATTERN, check_logit_bias


class _Field(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FunctionDefinition(_Field):
    name: str = Field(pattern=NAME_PATTERN)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # true: the arguments are constrained to `parameters`


class FunctionTool(_Field):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Field):
    name: str = Field(pattern=NAME_PATTERN)


class NamedToolChoice(_Field):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class JsonSchemaFormat(_Field):
    name: str = Field(pattern=NAME_PATTERN)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None  # strict or not, the schema is enforced (vLLM's structured outputs)

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class ResponseFormat(_Field):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_when_json_schema(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("response_format of type 'json_schema' needs `json_schema`")
        if self.type != "json_schema" and self.json_schema is not None:
            raise ValueError(f"`json_schema` is only valid with type 'json_schema', not {self.type!r}")
        return self


_LEADING_NAME = re.compile(r"^`?([a-z_][a-z0-9_]*)`?\s")


def model_check_param(message: str, fields: Any) -> str | None:
    """The field a model-level check names first (its message starts with it,
    e.g. "`tool_choice` needs `tools`"), when it is one of `fields`."""
    match = _LEADING_NAME.match(message)
    return match.group(1) if match and match.group(1) in fields else None


class LogitBiasMixin(BaseModel):
    logit_bias: dict[str, float] | None = None

    @field_validator("logit_bias")
    @classmethod
    def _check_logit_bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        return check_logit_bias(v)

    def logit_bias_ids(self) -> dict[int, float]:
        return {int(k): v for k, v in (self.logit_bias or {}).items()}


# Fields clients may send that change the result and that this gateway does
# not implement: each is refused with a 400 naming it (an unknown field is
# refused too, as OpenAI does).
REFUSED_FIELDS = {
    "functions": "the legacy `functions` field is not supported; use `tools`",
    "function_call": "the legacy `function_call` field is not supported; use `tool_choice`",
    "audio": "audio output is not supported",
    "prediction": "predicted outputs are not supported",
    "web_search_options": "web search is not supported",
    "use_beam_search": "beam search is not supported",
    "prompt_logprobs": "prompt logprobs are not supported",
    "echo": "`echo` is not supported",
    "bad_words": "`bad_words` is not supported",
    "allowed_token_ids": "`allowed_token_ids` is not supported",
    "guided_json": "vLLM's `guided_*` fields are not supported; use `response_format`",
    "guided_regex": "vLLM's `guided_*` fields are not supported; use `response_format`",
    "guided_choice": "vLLM's `guided_*` fields are not supported; use `response_format`",
    "guided_grammar": "vLLM's `guided_*` fields are not supported; use `response_format`",
    "structured_outputs": "vLLM's `structured_outputs` field is not supported; use `response_format`",
    "chat_template": "a per-request chat template is not supported",
    "continue_final_message": "`continue_final_message` is not supported",
    "add_generation_prompt": "`add_generation_prompt` is not supported",
    "cache_salt": "`cache_salt` is set by the gateway per tenant",
    "kv_transfer_params": "`kv_transfer_params` is internal to the gateway",
}


def unsupported_field_message(name: str) -> str:
    return REFUSED_FIELDS.get(name, f"Unrecognized request argument supplied: {name}")
