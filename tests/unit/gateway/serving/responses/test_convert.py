"""Responses API requests through vLLM's models: what is refused, what the
conversation and the stored turn become (no engine)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.http.errors import InvalidRequest
from gateway.serving.responses import convert

BASE = {"model": "m", "input": "hi"}
TOOL = {"type": "function", "name": "add", "parameters": {"type": "object"}, "strict": True}


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"background": True}, "background"),
        ({"truncation": "auto"}, "truncation"),
        ({"prompt": {"id": "p"}}, "prompt"),
        ({"request_id": "mine"}, "request_id"),
        ({"conversation": "c"}, "conversation"),
        ({"cache_salt": "s" * 10}, "cache_salt"),
        ({"no_such_field": 1}, "no_such_field"),
        ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"model": ""}, "model"),
        ({"temperature": "hot"}, "temperature"),
        ({"tools": [{"type": "function", "name": "a b", "parameters": {}}]}, "tools.0.name"),
        ({"tools": [{"type": "function", "parameters": {}}]}, "tools.0.name"),
        ({"tools": [{"type": "function", "name": "f"}], "tool_choice": "bogus"}, "tool_choice"),
    ],
)
def test_refused_and_invalid_fields_are_named(extra: dict, param: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        convert.parse_request({**BASE, **extra})
    assert err.value.param == param, err.value.message


def test_what_openai_clients_send_is_accepted() -> None:
    req = convert.parse_request(
        {
            **BASE,
            "instructions": "be brief",
            "include": ["reasoning.encrypted_content"],
            "reasoning": {"effort": "none"},
            "text": {"verbosity": "low"},
            "store": False,
            "prompt_cache_key": "thread-1",
            "safety_identifier": "u1",
            "stream_options": {"include_obfuscation": False},
            "tools": [TOOL],
            "tool_choice": "required",
            "parallel_tool_calls": False,
        }
    )
    spec, added = convert.turn_spec(req, [])
    assert spec.messages == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert added == [{"role": "user", "content": "hi"}]
    assert spec.tools is not None and spec.tools[0]["function"]["name"] == "add"
    assert spec.template_kwargs == {"reasoning_effort": "none", "verbosity": "low"}
    assert spec.parsing is req and spec.max_tokens_param == "max_output_tokens"


def test_a_continuation_puts_the_stored_history_before_the_new_items() -> None:
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get", "arguments": "{}"}}],
        },
    ]
    req = convert.parse_request(
        {
            **BASE,
            "instructions": "new rules",
            "input": [{"type": "function_call_output", "call_id": "c1", "output": "9C"}],
        }
    )
    spec, added = convert.turn_spec(req, history)
    assert spec.messages is not None and spec.messages[0] == {"role": "system", "content": "new rules"}
    assert spec.messages[1:3] == history
    assert added == [{"role": "tool", "content": "9C", "tool_call_id": "c1"}] == spec.messages[3:]
    assert spec.parsing is None  # no tools, no format: plain text


def test_function_call_items_in_the_input_become_assistant_tool_calls() -> None:
    req = convert.parse_request(
        {
            **BASE,
            "input": [
                {"role": "user", "content": "weather?"},
                {
                    "type": "function_call",
                    "id": "fc_1",
                    "call_id": "c1",
                    "name": "get",
                    "arguments": "{}",
                    "status": "completed",
                },
                {"type": "function_call_output", "call_id": "c1", "output": "9C"},
            ],
        }
    )
    spec, added = convert.turn_spec(req, [])
    assert [m["role"] for m in added] == ["user", "assistant", "tool"]
    assert added[1]["tool_calls"][0]["function"]["name"] == "get"


def test_non_text_input_is_refused() -> None:
    req = convert.parse_request(
        {**BASE, "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]}
    )
    with pytest.raises(InvalidRequest) as err:
        convert.turn_spec(req, [])
    assert err.value.param == "input.0.content"


def test_output_items_become_the_stored_assistant_message() -> None:
    items = [
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
        {"type": "function_call", "call_id": "c9", "name": "add", "arguments": '{"a":1}'},
    ]
    text, calls = convert.output_calls(items)
    assert text == "ok" and calls[0]["call_id"] == "c9"
    msg = convert.output_message(text, calls)
    assert msg["content"] == "ok" and msg["tool_calls"][0] == {
        "id": "c9",
        "type": "function",
        "function": {"name": "add", "arguments": '{"a":1}'},
    }
