"""Anthropic Messages requests and answers through vLLM's Anthropic code.

`parse_request(body)` validates with vLLM's `AnthropicMessagesRequest`
after refusing what this gateway does not honour (`REFUSED`, extended
thinking, unknown fields). `turn_spec(req)` converts with vLLM's
`AnthropicServingMessages.to_chat_completion_request` (system blocks,
`tool_use` / `tool_result` blocks, tools, tool_choice auto/any/tool/none,
`output_config.format`) and keeps the chat request for vLLM's parser.
`full_message(...)` turns the chat-shaped output into Anthropic's with
vLLM's `messages_full_converter`, which never reads its instance: it is
called unbound, pinned to vLLM 0.32. Streams are encoded from the turn's
deltas directly (events.py).

Errors are Anthropic-shaped: {"type": "error", "error": {"type", "message"}}.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from fastapi.responses import JSONResponse

from gateway.http.errors import GatewayError, InvalidRequest
from gateway.serving.anthropic.context_edits import apply_edits
from gateway.serving.turn.accounting import usage_dict
from gateway.serving.turn.choices import ChoiceResult
from gateway.serving.turn.fields import plain
from gateway.serving.turn.parsing import invalid_request, validate
from gateway.serving.turn.spec import Sampling, TurnSpec, unset_fields

REFUSED = {
    "mm_payload": "`mm_payload` is not supported",
    "return_mm_kwargs": "`return_mm_kwargs` is not supported",
    "cache_salt": "`cache_salt` is set by the gateway per tenant",
    "watermarking": "watermarking is not supported",
    "kv_transfer_params": "`kv_transfer_params` is internal to the gateway",
    "ec_transfer_params": "`ec_transfer_params` is not supported",
    "vllm_xargs": "`vllm_xargs` is not supported",
    "container": "code execution containers are not supported",
    "mcp_servers": "MCP servers are not supported",
    "output_format": "`output_format` is not supported; use `output_config.format`",
}
ACCEPTED_EXTRA = frozenset({"service_tier"})  # no effect on the output here
HONOURED = frozenset({"context_management"})  # applied here, not a field of vLLM's request model
TEXT_PARTS = frozenset({"text"})
_NOT_TEXT = "content of type {kind!r} is not supported (text only)"
_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def error_body(exc: GatewayError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": _ERROR_TYPES.get(exc.status, "api_error"), "message": exc.message}}


def error_response(exc: GatewayError) -> JSONResponse:
    return JSONResponse(error_body(exc), status_code=exc.status, headers=exc.headers)


def error_event(exc: GatewayError) -> bytes:
    return f"event: error\ndata: {json.dumps(error_body(exc))}\n\n".encode()


def parse_request(
    body: dict[str, Any],
    *,
    count_tokens: bool = False,
    reasoning: bool = False,
    text_tokens: Callable[[str], int] = lambda text: len(text) // 4,
) -> Any:
    """vLLM's Anthropic request for this body, or a 400 naming what is refused.

    `reasoning`: the gateway has a reasoning parser. `thinking` of type
    "adaptive" lets the model choose how much to think: through the template
    with a reasoning parser; a model without one does not think, which is
    what "adaptive" allows. "enabled" with a token budget is refused: nothing
    enforces the budget. `context_management` edits are applied to the
    messages first (context_edits), their tokens counted by `text_tokens`."""
    from vllm.entrypoints.anthropic.protocol import AnthropicCountTokensRequest, AnthropicMessagesRequest

    model = AnthropicCountTokensRequest if count_tokens else AnthropicMessagesRequest
    for name in body:
        if name in REFUSED:
            raise InvalidRequest(REFUSED[name], param=name)
        if name not in model.model_fields and name not in ACCEPTED_EXTRA and name not in HONOURED:
            raise InvalidRequest(f"{name}: Extra inputs are not permitted", param=name)
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "enabled":
        raise InvalidRequest("extended thinking with a token budget is not supported", param="thinking")
    if "context_management" in body:
        messages, _ = apply_edits(body.get("messages") or [], body["context_management"], text_tokens)
        body = {**body, "messages": messages}
    fields = {k: v for k, v in body.items() if k not in ACCEPTED_EXTRA and k != "context_management"}
    req = validate(model, fields)
    check_tools(req.tools, req.tool_choice)
    return req


def check_tools(tools: list[Any] | None, tool_choice: Any) -> None:
    """Anthropic's rules that vLLM's models leave to the server: tool names
    match `^[a-zA-Z0-9_-]{1,64}$`, and a `tool_choice` that asks for a call
    (`any`, `tool`) comes with tools, a named one with a tool of that name."""
    names = []
    for i, tool in enumerate(tools or []):
        if not _TOOL_NAME.fullmatch(tool.name):
            raise InvalidRequest(f"tools.{i}.name: {tool.name!r} does not match {_TOOL_NAME.pattern}", param="tools")
        names.append(tool.name)
    kind = tool_choice.type if tool_choice is not None else None
    if kind in ("any", "tool") and not names:
        raise InvalidRequest(f"tool_choice {kind!r} needs tools", param="tool_choice")
    if kind == "tool" and tool_choice.name not in names:
        raise InvalidRequest(f"tool_choice names {tool_choice.name!r}, which is not in tools", param="tool_choice")


def _refuse_images(messages: list[Any]) -> None:
    """Image blocks, in a message or a `tool_result`, refused as the client
    sent them (vLLM's converter makes them `image_url` parts: text only here)."""
    for i, m in enumerate(messages):
        for j, block in enumerate(m.content if isinstance(m.content, list) else []):
            if block.type == "image":
                raise InvalidRequest(_NOT_TEXT.format(kind="image"), param=f"messages.{i}.content.{j}")
            if block.type == "tool_result" and isinstance(block.content, list):
                for k, item in enumerate(block.content):
                    if isinstance(item, dict) and item.get("type") == "image":
                        raise InvalidRequest(
                            _NOT_TEXT.format(kind="image"), param=f"messages.{i}.content.{j}.content.{k}"
                        )


def _check_text_only(messages: list[dict[str, Any]]) -> None:
    """What else the converter made of a block that is not text (a `tool_reference` in a `tool_result`)."""
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            for part in content:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind not in TEXT_PARTS:
                    raise InvalidRequest(_NOT_TEXT.format(kind=kind), param="messages")


def chat_request(req: Any) -> Any:
    from vllm.entrypoints.anthropic.serving import AnthropicServingMessages
    from vllm.exceptions import VLLMValidationError

    try:
        return AnthropicServingMessages.to_chat_completion_request(req)
    except (ValueError, TypeError, VLLMValidationError) as exc:
        raise invalid_request(exc, prefix="messages") from exc


def turn_spec(req: Any) -> TurnSpec:
    creq = chat_request(req)
    _refuse_images(req.messages)
    messages = plain(creq.messages)
    _check_text_only(messages)
    tools = [t.model_dump(exclude_none=True) for t in creq.tools] if creq.tools else None
    kwargs: dict[str, Any] = dict(creq.chat_template_kwargs or {})
    if creq.reasoning_effort is not None:
        kwargs.setdefault("reasoning_effort", creq.reasoning_effort)
    stop = creq.stop
    return TurnSpec(
        messages=messages,
        tools=tools,
        template_kwargs=kwargs,
        max_tokens=req.max_tokens,
        max_tokens_param="max_tokens",
        sampling=Sampling(
            temperature=req.temperature if req.temperature is not None else 1.0,
            top_p=req.top_p if req.top_p is not None else 1.0,
            top_k=req.top_k or 0,
            stop=tuple([stop] if isinstance(stop, str) else (stop or [])),
        ),
        parsing=creq if (tools or creq.response_format is not None) else None,
        constraint_param="output_config.format",
        unset=unset_fields(req),
    )


def count_tokens_spec(req: Any) -> TurnSpec:
    creq = chat_request(req)
    messages = plain(creq.messages)
    tools = [t.model_dump(exclude_none=True) for t in creq.tools] if creq.tools else None
    return TurnSpec(messages=messages, tools=tools, template_kwargs=dict(creq.chat_template_kwargs or {}))


def full_message(message_id: str, model: str, result: ChoiceResult) -> dict[str, Any]:
    """The non-streamed Anthropic message, through vLLM's chat -> Anthropic converter."""
    from vllm.entrypoints.anthropic.serving import AnthropicServingMessages
    from vllm.entrypoints.openai.chat_completion.protocol import (
        ChatCompletionResponse,
        ChatCompletionResponseChoice,
        ChatMessage,
    )

    from gateway.serving.turn.parsing import new_tool_call_id

    calls = [
        {"id": c.id or new_tool_call_id(), "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in result.tool_calls
    ]
    chat = ChatCompletionResponse(
        id=message_id,
        model=model,
        usage=usage_dict([result.finished]),
        choices=[
            ChatCompletionResponseChoice(
                index=0,
                message=ChatMessage(
                    role="assistant", content=result.content or None, reasoning=result.reasoning, tool_calls=calls
                ),
                finish_reason=result.finish_reason,
                stop_reason=result.stop_string,
            )
        ],
    )
    # vLLM's converter is called unbound: it reads nothing of the serving object it is declared on.
    message = AnthropicServingMessages.messages_full_converter(None, chat)  # type: ignore[arg-type]
    data: dict[str, Any] = message.model_dump(mode="json", exclude_none=True)
    data.pop("kv_transfer_params", None)
    data.pop("ec_transfer_params", None)
    return data
