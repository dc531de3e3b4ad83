"""OpenAI wire models: what clients send and what the gateway answers.

Requests accept (and ignore) fields the SDKs send that do not change the
result here (`user`, `metadata`, penalties, `parallel_tool_calls`, ...);
fields that would change it and are unsupported are rejected with 400
(`n > 1`, `logprobs`, `echo`, `suffix`, `best_of > 1`, non-text content).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from workers.protocol import MAX_TOKENS_LIMIT

MAX_STOP = 16


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow")


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

    def template_dict(self) -> dict[str, Any]:
        """The message as the chat template expects it (plain dicts)."""
        out: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role}
        if isinstance(self.content, list):
            out["content"] = "".join(p.text or "" for p in self.content)
        else:
            out["content"] = self.content or ""
        if self.name:
            out["name"] = self.name
        if self.tool_calls:
            out["tool_calls"] = [
                {"id": c.id, "type": c.type, "function": {"name": c.function.name, "arguments": c.function.arguments}}
                for c in self.tool_calls
            ]
        if self.tool_call_id:
            out["tool_call_id"] = self.tool_call_id
        return out


class StreamOptions(_Request):
    include_usage: bool = False


class _Sampling(_Request):
    model: str = Field(min_length=1, max_length=256)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    n: int | None = Field(1, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: bool | int | None = None

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, list) and len(v) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop sequences")
        return v

    @model_validator(mode="after")
    def _check_unsupported(self) -> _Sampling:
        if self.n not in (None, 1):
            raise ValueError("only n=1 is supported")
        if self.logprobs:
            raise ValueError("logprobs are not supported")
        return self

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
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_Sampling):
    prompt: str | list[int] | list[str] = Field(...)
    max_tokens: int | None = Field(16, ge=1, le=MAX_TOKENS_LIMIT)
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


class ChatChoice(_Response):
    index: int = 0
    message: AssistantMessage
    logprobs: None = None
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
    logprobs: None = None
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


class ModelList(_Response):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class BranchFinished(_Response):
    id: str
    object: Literal["branch"] = "branch"
    finished: bool
