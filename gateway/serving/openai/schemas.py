"""OpenAI wire models: what clients send and what the gateway answers.

Every request field is honoured, accepted because it does not change the
result (`user`, `metadata`, `store`, `service_tier`, `safety_identifier`,
`prompt_cache_retention`; `prompt_cache_key` names the branch), or refused
with a 400 naming it (`request_fields.REFUSED_FIELDS`, non-text content,
and, as OpenAI does, any field it does not know). Bounds are OpenAI's
(temperature 0-2, penalties -2..2, top_logprobs 0-20, logit_bias -100..100,
n 1-128); vLLM's sampling extensions (`top_k`, `min_p`,
`repetition_penalty`, `min_tokens`, `stop_token_ids`, `ignore_eos`,
`chat_template_kwargs`) are honoured too.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gateway.serving.openai.request_fields import (
    FunctionTool,
    LogitBiasMixin,
    ResponseFormat,
    ToolChoice,
)
from workers.protocol import MAX_LOGPROBS, MAX_TOKENS_LIMIT

MAX_STOP = 16
MAX_N = 128
# Names the chat template itself takes; `chat_template_kwargs` may not override them.
RESERVED_TEMPLATE_KWARGS = frozenset({"messages", "tools", "tool_choice", "add_generation_prompt", "tokenize"})


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow")


class _TopLevel(BaseModel):
    """A request body: an unknown field is refused (400 naming it), as OpenAI does."""

    model_config = ConfigDict(extra="forbid")


class _Response(BaseModel):
    model_config = ConfigDict(extra="forbid")


# -- requests ------------------------------------------------------------------
class FunctionCall(_Request):
    name: str
    arguments: str = ""


class ToolCall(_Request):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ContentPart(_Request):
    type: str
    text: str | None = None

    @field_validator("type")
    @classmethod
    def _text_only(cls, v: str) -> str:
        if v not in ("text", "input_text"):
            raise ValueError(f"content part type {v!r} is not supported (text only)")
        return v


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    def chat_message(self) -> dict[str, Any]:
        """The message as the client sent it, in plain JSON. vLLM's chat parsing
        (gateway.serving.chat_render) makes it what the template expects:
        parts joined, no None content, developer as system where needed."""
        return self.model_dump(mode="json", exclude_none=True)


class StreamOptions(_Request):
    include_usage: bool = False


class _Sampling(_TopLevel, LogitBiasMixin):
    model: str = Field(min_length=1, max_length=256)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    n: int | None = Field(1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    # vLLM's sampling extensions
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=2.0)
    min_tokens: int | None = Field(None, ge=0, le=MAX_TOKENS_LIMIT)
    stop_token_ids: list[int] | None = Field(None, max_length=64)
    ignore_eos: bool | None = None
    # accepted, no effect on the result
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_key: str | None = None  # names the branch when no X-Branch-ID is sent

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, list) and len(v) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop sequences")
        return v

    @field_validator("stop_token_ids")
    @classmethod
    def _check_stop_ids(cls, v: list[int] | None) -> list[int] | None:
        if v and any(t < 0 for t in v):
            raise ValueError("stop_token_ids must be non-negative token ids")
        return v

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    # Bounded like the worker protocol's SamplingOptions: a larger value is a
    # client error (400), not an internal one.
    max_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS_LIMIT)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS_LIMIT)
    tools: list[FunctionTool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    # passed to the chat template as variables
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    verbosity: Literal["low", "medium", "high"] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    modalities: list[Literal["text"]] | None = None

    @model_validator(mode="after")
    def _check_chat(self) -> ChatCompletionRequest:
        if self.tools == []:
            raise ValueError("`tools` must not be an empty array; omit it instead")
        if self.tool_choice not in (None, "none") and not self.tools:
            raise ValueError("`tool_choice` needs `tools`")
        if isinstance(self.tool_choice, BaseModel) and self.tools:
            name = self.tool_choice.function.name
            if name not in {t.function.name for t in self.tools}:
                raise ValueError(f"tool_choice names the function {name!r}, which is not in `tools`")
        if self.top_logprobs and not self.logprobs:
            raise ValueError("`top_logprobs` needs `logprobs: true`")
        if self.stream_options is not None and not self.stream:
            raise ValueError("`stream_options` needs `stream: true`")
        reserved = RESERVED_TEMPLATE_KWARGS & set(self.chat_template_kwargs or {})
        if reserved:
            raise ValueError(f"chat_template_kwargs may not set {sorted(reserved)}")
        return self

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def max_tokens_param(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens else "max_tokens"


class CompletionRequest(_Sampling):
    prompt: str | list[int] | list[str] = Field(...)
    max_tokens: int | None = Field(16, ge=1, le=MAX_TOKENS_LIMIT)
    logprobs: int | None = Field(None, ge=0, le=5)  # the legacy API: top alternatives per token
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    @model_validator(mode="after")
    def _check_completion(self) -> CompletionRequest:
        if self.echo or self.suffix or (self.best_of or 1) > 1:
            raise ValueError("echo, suffix and best_of > 1 are not supported")
        if isinstance(self.prompt, list):
            if not self.prompt:
                raise ValueError("prompt must not be empty")
            if isinstance(self.prompt[0], str) and len(self.prompt) != 1:
                raise ValueError("only one prompt per request is supported")
        if self.stream_options is not None and not self.stream:
            raise ValueError("`stream_options` needs `stream: true`")
        return self


# -- responses -------------------------------------------------------------------
class PromptTokensDetails(_Response):
    cached_tokens: int = 0


class Usage(_Response):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)

    @classmethod
    def of(cls, prompt: int, completion: int, cached: int) -> Usage:
        return cls(
            prompt_tokens=prompt,
            completion_tokens=completion,
            total_tokens=prompt + completion,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=cached),
        )


class AssistantMessage(_Response):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | None = None
    # what a reasoning parser split off (vLLM's field); absent without one
    reasoning: str | None = Field(None, exclude_if=lambda v: v is None)


class TopLogprob(_Response):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(_Response):
    content: list[TokenLogprob] | None = None
    refusal: list[TokenLogprob] | None = None


class CompletionLogprobs(_Response):
    """The legacy completions shape: parallel lists, one entry per token."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float] = Field(default_factory=list)
    top_logprobs: list[dict[str, float]] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class ChatChoice(_Response):
    index: int = 0
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str


class ChatCompletion(_Response):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChunkDelta(_Response):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(_Response):
    index: int = 0
    delta: ChunkDelta
    logprobs: None = None
    finish_reason: str | None = None


class ChatCompletionChunk(_Response):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionChoice(_Response):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None


class Completion(_Response):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class CompletionChunk(Completion):
    pass


class ModelCard(_Response):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "evolving-infra"
    # The context length (prompt + output tokens) served, as vLLM's /v1/models reports it.
    max_model_len: int | None = None


class ModelList(_Response):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class BranchFinished(_Response):
    id: str
    object: Literal["branch"] = "branch"
    finished: bool
