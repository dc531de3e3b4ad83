"""Responses API requests through vLLM's own models and helpers.

`parse_request(body)` validates with vLLM's `ResponsesRequest` after
refusing, with a 400 naming them, the fields this gateway does not honour
(`REFUSED`, value-dependent ones in `_refuse_values`, unknown fields).
`turn_spec(req, history)` builds the chat conversation with vLLM's
`construct_input_messages` (instructions, the stored history of a
`previous_response_id` chain, the new input items: messages,
`function_call`, `function_call_output`), the tools with vLLM's
`construct_tool_dicts`, and passes the request itself to vLLM's parser for
tool calls and `text.format`. `output_message` is the assistant message a
turn adds to the stored conversation.
"""

from __future__ import annotations

import json
import re
from typing import Any, cast

from gateway.http.errors import InvalidRequest
from gateway.serving.turn.fields import NAME_PATTERN, check_logit_bias, plain
from gateway.serving.turn.parsing import invalid_request, validate
from gateway.serving.turn.spec import Sampling, TurnSpec, unset_fields

# Fields of vLLM's ResponsesRequest this gateway does not take from clients.
REFUSED = {
    "prompt": "prompt templates are not supported",
    "request_id": "response ids are chosen by the gateway",
    "session_id": "send the session as X-Session-ID",
    "previous_input_messages": "`previous_input_messages` is not supported; use `previous_response_id`",
    "structured_outputs": "vLLM's `structured_outputs` is not supported; use `text.format`",
    "cache_salt": "`cache_salt` is set by the gateway per tenant",
    "kv_transfer_params": "`kv_transfer_params` is internal to the gateway",
    "ec_transfer_params": "`ec_transfer_params` is not supported",
    "vllm_xargs": "`vllm_xargs` is not supported",
    "media_io_kwargs": "media inputs are not supported",
    "mm_processor_kwargs": "media inputs are not supported",
    "mm_payload": "`mm_payload` is not supported",
    "return_mm_kwargs": "`return_mm_kwargs` is not supported",
    "watermarking": "watermarking is not supported",
    "conversation": "the Conversations API is not supported; use `previous_response_id`",
}
# Sent by OpenAI clients, no effect on the output here; dropped before validation.
# `client_metadata`: Codex's ids of its window, turn and installation (the branch comes from its headers).
ACCEPTED_EXTRA = frozenset({"safety_identifier", "prompt_cache_retention", "stream_options", "client_metadata"})
TEXT_PARTS = frozenset({"input_text", "output_text", "text", "refusal"})


def _refused(field: str, message: str) -> InvalidRequest:
    return InvalidRequest(message, param=field, code="unsupported_field")


def parse_request(body: dict[str, Any]) -> Any:
    """vLLM's `ResponsesRequest` for this body, or a 400 naming what is refused."""
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest

    fields = ResponsesRequest.model_fields
    for name in body:
        if name in REFUSED:
            raise _refused(name, REFUSED[name])
        if name not in fields and name not in ACCEPTED_EXTRA:
            raise _refused(name, f"Unrecognized request argument supplied: {name}")
    _refuse_values(body)
    return validate(ResponsesRequest, {k: v for k, v in body.items() if k not in ACCEPTED_EXTRA})


def _refuse_values(body: dict[str, Any]) -> None:
    if body.get("background"):
        raise _refused("background", "background responses are not supported")
    if body.get("truncation") not in (None, "disabled"):
        raise _refused("truncation", 'only truncation "disabled" is supported')
    if body.get("priority", 0) != 0:
        raise _refused("priority", "request priority comes from the tenant policy")
    if body.get("enable_response_messages"):
        raise _refused("enable_response_messages", "`enable_response_messages` is not supported")
    if body.get("skip_special_tokens") is False:
        raise _refused("skip_special_tokens", "`skip_special_tokens: false` is not supported")
    if body.get("include_stop_str_in_output"):
        raise _refused("include_stop_str_in_output", "`include_stop_str_in_output` is not supported")
    if body.get("model") in (None, ""):
        raise InvalidRequest("you must provide a model parameter", param="model")
    try:
        check_logit_bias(body.get("logit_bias"))
    except ValueError as exc:
        raise InvalidRequest(str(exc), param="logit_bias") from exc
    for i, tool in enumerate(body.get("tools") or []):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise _refused(f"tools.{i}.type", f"only function tools are supported, not {kind!r}")
        name = tool.get("name")
        if not isinstance(name, str) or not re.fullmatch(NAME_PATTERN, name):
            raise InvalidRequest(f"tools.{i}.name: {name!r} does not match {NAME_PATTERN}", param=f"tools.{i}.name")


def _check_text_only(messages: list[dict[str, Any]]) -> None:
    for i, m in enumerate(messages):
        content = m.get("content")
        if isinstance(content, list):
            for part in content:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind not in TEXT_PARTS:
                    raise InvalidRequest(
                        f"content part type {kind!r} is not supported (text only)", param=f"input.{i}.content"
                    )


def turn_spec(req: Any, history: list[dict[str, Any]]) -> tuple[TurnSpec, list[dict[str, Any]]]:
    """The spec of a Responses request continuing `history` (the stored
    conversation), and the messages its input adds (what the store keeps)."""
    from vllm.entrypoints.openai.responses.utils import construct_input_messages, construct_tool_dicts
    from vllm.exceptions import VLLMValidationError

    try:
        messages = plain(
            construct_input_messages(
                request_instructions=req.instructions, request_input=req.input, prev_msg=cast(Any, history) or None
            )
        )
        tools = construct_tool_dicts(req.tools, req.tool_choice)
    except (VLLMValidationError, ValueError, TypeError) as exc:
        raise invalid_request(exc, prefix="input") from exc
    _check_text_only(messages)
    added = messages[len(messages) - _input_count(req.input, messages) :]
    tool_dicts = [plain(t) for t in tools] if tools else None
    kwargs: dict[str, Any] = dict(req.chat_template_kwargs or {})
    if req.reasoning is not None and req.reasoning.effort is not None:
        kwargs.setdefault("reasoning_effort", req.reasoning.effort)
    if req.text is not None and getattr(req.text, "verbosity", None) is not None:
        kwargs.setdefault("verbosity", req.text.verbosity)
    wants_logprobs = "message.output_text.logprobs" in (req.include or []) or bool(req.top_logprobs)
    fmt = req.text.format if req.text is not None else None
    constrained = fmt is not None and fmt.type != "text"
    spec = TurnSpec(
        messages=messages,
        tools=tool_dicts,
        template_kwargs=kwargs,
        max_tokens=req.max_output_tokens,
        max_tokens_param="max_output_tokens",
        sampling=Sampling(
            temperature=req.temperature if req.temperature is not None else 1.0,
            top_p=req.top_p if req.top_p is not None else 1.0,
            top_k=req.top_k or 0,
            min_p=req.min_p or 0.0,
            presence_penalty=req.presence_penalty or 0.0,
            frequency_penalty=req.frequency_penalty or 0.0,
            repetition_penalty=req.repetition_penalty if req.repetition_penalty is not None else 1.0,
            logit_bias={int(k): v for k, v in (req.logit_bias or {}).items()},
            seed=req.seed,
            stop=tuple([req.stop] if isinstance(req.stop, str) else (req.stop or [])),
            stop_token_ids=tuple(req.stop_token_ids or ()),
            ignore_eos=req.ignore_eos,
            logprobs=(req.top_logprobs or 0) if wants_logprobs else None,
        ),
        parsing=req if (tool_dicts or constrained) else None,
        constraint_param="text.format",
        unset=unset_fields(req),
    )
    return spec, added


def _input_count(request_input: Any, messages: list[dict[str, Any]]) -> int:
    """How many of `messages` the request's own input made (they come last)."""
    from vllm.entrypoints.openai.responses.utils import construct_chat_messages_with_tool_call

    if isinstance(request_input, str):
        return 1
    return min(len(construct_chat_messages_with_tool_call(request_input)), len(messages))


def output_message(content: str | None, tool_calls: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant message an output adds to the conversation (chat form)."""
    message: dict[str, Any] = {"role": "assistant", "content": content or ""}
    if tool_calls:
        message["tool_calls"] = [
            {"id": c["call_id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in tool_calls
        ]
    return message


def output_calls(items: list[Any]) -> tuple[str | None, list[dict[str, Any]]]:
    """(text, function calls) of a response's output items."""
    text: list[str] = []
    calls: list[dict[str, Any]] = []
    for item in items:
        data = plain(item)
        if data.get("type") == "message":
            text.extend(part.get("text", "") for part in data.get("content", []) if part.get("type") == "output_text")
        elif data.get("type") == "function_call":
            calls.append(data)
    return ("".join(text) or None), calls


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
