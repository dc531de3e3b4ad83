"""Anthropic Messages requests through vLLM's Anthropic converter (no engine)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.http.errors import InvalidRequest, RateLimited
from gateway.serving.anthropic import convert

BASE = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
TOOLS = [{"name": "add", "input_schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"thinking": {"type": "enabled", "budget_tokens": 2048}, "max_tokens": 4096}, "thinking"),
        ({"mcp_servers": []}, "mcp_servers"),
        ({"context_management": {}}, "context_management.edits"),
        ({"context_management": {"edits": [{"type": "bogus"}]}}, "context_management.edits.0.type"),
        ({"output_format": {"type": "json_schema"}}, "output_format"),
        ({"kv_transfer_params": {}}, "kv_transfer_params"),
        ({"bogus": 1}, "bogus"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"tool_choice": {"type": "tool"}, "tools": TOOLS}, "tool_choice"),
        ({"tool_choice": {"type": "tool", "name": "sub"}, "tools": TOOLS}, "tool_choice"),
        ({"tool_choice": {"type": "any"}}, "tool_choice"),
        ({"tool_choice": {"type": "tool", "name": "add"}}, "tool_choice"),
        ({"tools": [{"name": "a b", "input_schema": {"type": "object"}}]}, "tools"),
        ({"tools": [{"name": "x" * 65, "input_schema": {"type": "object"}}]}, "tools"),
    ],
)
def test_refused_and_invalid_fields_are_named(extra: dict, param: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        convert.parse_request({**BASE, **extra})
    assert err.value.param == param, err.value.message


def test_claude_codes_default_request_fields_are_honoured() -> None:
    # Claude Code 2.1: adaptive thinking (a model without reasoning does not think), an effort,
    # its default context edit, a system message inside `messages`.
    req = convert.parse_request(
        {
            **BASE,
            "thinking": {"type": "adaptive", "display": "omitted"},
            "output_config": {"effort": "high"},
            "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                {"role": "system", "content": [{"type": "text", "text": "reminder"}]},
            ],
        }
    )
    messages = convert.turn_spec(req).messages or []
    assert [m["role"] for m in messages] == ["user", "system"]


@pytest.mark.parametrize("choice", [None, {"type": "auto"}, {"type": "none"}, {"type": "any"}])
def test_tool_choices_that_need_no_named_tool_are_accepted(choice: dict | None) -> None:
    body = {**BASE, "tools": TOOLS} if choice is None else {**BASE, "tools": TOOLS, "tool_choice": choice}
    assert convert.parse_request(body).tools[0].name == "add"


def test_system_blocks_tools_and_a_forced_tool_become_a_chat_request() -> None:
    req = convert.parse_request(
        {
            **BASE,
            "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
            "tools": TOOLS,
            "tool_choice": {"type": "tool", "name": "add", "disable_parallel_tool_use": True},
            "stop_sequences": ["END"],
            "top_k": 5,
            "metadata": {"user_id": "user_x_account__session_1234abcd-0000"},
            "service_tier": "auto",
        }
    )
    spec = convert.turn_spec(req)
    assert spec.messages == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert spec.tools is not None and spec.tools[0]["function"]["name"] == "add"
    assert spec.sampling.stop == ("END",) and spec.sampling.top_k == 5 and spec.max_tokens == 16
    creq = spec.parsing
    assert creq.tool_choice.function.name == "add" and creq.parallel_tool_calls is False


def test_tool_use_and_tool_result_blocks_replay_as_chat_messages() -> None:
    req = convert.parse_request(
        {
            **BASE,
            "tools": TOOLS,
            "messages": [
                {"role": "user", "content": "add"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "add", "input": {"a": 1}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "1"}]},
            ],
        }
    )
    messages = convert.turn_spec(req).messages
    assert messages is not None
    assert messages[1]["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a": 1}'}
    assert messages[2] == {"role": "tool", "tool_call_id": "t1", "content": "1"}


IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
TOOL_USE = {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "add", "input": {}}]}


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([{"role": "user", "content": [IMAGE]}], "messages.0.content.0"),
        (
            [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "yes"},
                {"role": "user", "content": [{"type": "text", "text": "see"}, IMAGE]},
            ],
            "messages.2.content.1",
        ),
        (
            [
                {"role": "user", "content": "add"},
                TOOL_USE,
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "1"}, IMAGE]}
                    ],
                },
            ],
            "messages.2.content.0.content.1",
        ),
    ],
)
def test_images_are_refused_as_the_client_sent_them(messages: list[dict[str, Any]], param: str) -> None:
    req = convert.parse_request({**BASE, "messages": messages})
    with pytest.raises(InvalidRequest) as err:
        convert.turn_spec(req)
    assert err.value.message == "content of type 'image' is not supported (text only)"  # not vLLM's 'image_url'
    assert err.value.param == param


def test_a_tool_reference_in_a_tool_result_is_refused() -> None:
    reference = {"type": "tool_reference", "tool_name": "add"}
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [reference]}]}
    req = convert.parse_request({**BASE, "messages": [{"role": "user", "content": "add"}, TOOL_USE, result]})
    with pytest.raises(InvalidRequest) as err:
        convert.turn_spec(req)
    assert err.value.message == "content of type 'tool_reference' is not supported (text only)"


def test_errors_are_anthropic_shaped() -> None:
    body = convert.error_body(InvalidRequest("bad", param="x"))
    assert body == {"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}
    limited = convert.error_response(RateLimited("slow down", retry_after_s=2))
    assert limited.status_code == 429 and limited.headers["retry-after"] == "2"
    assert b'"rate_limit_error"' in limited.body
