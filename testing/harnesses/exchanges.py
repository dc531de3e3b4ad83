"""What one recorded exchange says, read the way each API writes it (pure).

Generation requests are the three completion APIs the harnesses speak:
Chat Completions, Responses and Messages. For each one this reads, from the
gateway's own answer: whether the body (or every SSE event) parsed, the usage
it reported (prompt and cached tokens), why the output stopped, and the
branch the gateway put the request on (`X-Branch-ID`). From the request it
reads whether the newest input is a tool result, i.e. the request closes a
tool round trip.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from testing.harnesses.recorder import Exchange

GENERATION_PATHS = {"/v1/chat/completions": "chat", "/v1/responses": "responses", "/v1/messages": "messages"}


@dataclass(frozen=True)
class Reading:
    api: str  # chat | responses | messages | other
    status: int
    parsed: bool  # the JSON body, or every SSE event, parsed
    streamed: bool
    branch: str | None
    prompt_tokens: int | None
    cached_tokens: int | None
    stop: str | None  # stop / length / tool_calls, end_turn / max_tokens / tool_use, completed / incomplete
    tool_result: bool  # the request's newest input is a tool result
    tool_call: bool  # the answer asks for a tool

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


def api_of(ex: Exchange) -> str:
    return GENERATION_PATHS.get(ex.path.rstrip("/"), "other") if ex.method == "POST" else "other"


def sse_events(body: bytes) -> list[dict[str, Any]] | None:
    """The JSON payloads of an SSE body; None when one does not parse."""
    events: list[dict[str, Any]] = []
    for block in body.decode("utf-8", "replace").replace("\r\n", "\n").split("\n\n"):
        data = "\n".join(line[5:].lstrip() for line in block.split("\n") if line.startswith("data:"))
        if not data or data == "[DONE]":
            continue
        try:
            value = json.loads(data)
        except json.JSONDecodeError:
            return None
        if isinstance(value, dict):
            events.append(value)
    return events


def _body_json(raw: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(raw or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


def _usage(api: str, events: list[dict[str, Any]]) -> tuple[int | None, int | None]:
    """(prompt tokens, cached prompt tokens) the gateway reported, last report wins."""
    prompt = cached = None
    for e in events:
        if api == "chat" and isinstance(e.get("usage"), dict):
            u = e["usage"]
            prompt = u.get("prompt_tokens", prompt)
            cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens", cached)
        elif api == "responses":
            u = (e.get("response") or e).get("usage") if isinstance(e.get("response") or e, dict) else None
            if isinstance(u, dict):
                prompt = u.get("input_tokens", prompt)
                cached = (u.get("input_tokens_details") or {}).get("cached_tokens", cached)
        elif api == "messages":
            u = (e.get("message") or {}).get("usage") or e.get("usage")
            if isinstance(u, dict):
                if "input_tokens" in u:
                    prompt = u["input_tokens"] + (u.get("cache_read_input_tokens") or 0)
                if u.get("cache_read_input_tokens") is not None:
                    cached = u["cache_read_input_tokens"]
    return prompt, cached


def _stop_and_tool_call(api: str, events: list[dict[str, Any]]) -> tuple[str | None, bool]:
    stop, tool = None, False
    for e in events:
        if api == "chat":
            for choice in e.get("choices") or []:
                stop = choice.get("finish_reason") or stop
                delta = choice.get("delta") or choice.get("message") or {}
                tool = tool or bool(delta.get("tool_calls"))
        elif api == "responses":
            response: dict[str, Any] = e["response"] if isinstance(e.get("response"), dict) else e
            if e.get("type") in (None, "response.completed", "response.incomplete", "response.failed"):
                stop = response.get("status") or stop
                for item in response.get("output") or []:
                    tool = tool or item.get("type") == "function_call"
        elif api == "messages":
            message: dict[str, Any] = e["message"] if isinstance(e.get("message"), dict) else e
            stop = (e.get("delta") or {}).get("stop_reason") or message.get("stop_reason") or stop
            blocks = [e.get("content_block") or {}, *(message.get("content") or [])]
            tool = tool or any(isinstance(b, dict) and b.get("type") == "tool_use" for b in blocks)
    return stop, tool


def newest_input_is_tool_result(api: str, body: dict[str, Any] | None) -> bool:
    if body is None:
        return False
    if api == "chat":
        messages = body.get("messages") or []
        return bool(messages) and messages[-1].get("role") == "tool"
    if api == "responses":
        items = body.get("input")
        if not isinstance(items, list) or not items:
            return False
        return isinstance(items[-1], dict) and items[-1].get("type") == "function_call_output"
    if api == "messages":
        messages = body.get("messages") or []
        if not messages or messages[-1].get("role") != "user" or not isinstance(messages[-1].get("content"), list):
            return False
        return any(isinstance(b, dict) and b.get("type") == "tool_result" for b in messages[-1]["content"])
    return False


def read(ex: Exchange) -> Reading:
    api = api_of(ex)
    content_type = ex.response_headers.get("content-type", "")
    streamed = content_type.startswith("text/event-stream")
    if streamed:
        events = sse_events(ex.response_body)
        parsed = events is not None and not ex.error
    else:
        body = _body_json(ex.response_body)
        events = [body] if body is not None else None
        parsed = body is not None or not ex.response_body
    events = events or []
    prompt, cached = _usage(api, events) if api != "other" else (None, None)
    stop, tool_call = _stop_and_tool_call(api, events) if api != "other" else (None, False)
    return Reading(
        api=api,
        status=ex.status,
        parsed=parsed,
        streamed=streamed,
        branch=ex.response_headers.get("x-branch-id"),
        prompt_tokens=prompt,
        cached_tokens=cached,
        stop=stop,
        tool_result=newest_input_is_tool_result(api, _body_json(ex.request_body)),
        tool_call=tool_call,
    )
