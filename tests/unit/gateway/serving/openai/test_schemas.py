"""OpenAI request validation (every field honoured or refused, OpenAI's bounds),
branch headers, text assembly, the demo chat template."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from gateway.http.errors import InvalidRequest
from gateway.serving.openai.request_fields import model_check_param
from gateway.serving.openai.routes import parse_model
from gateway.serving.openai.schemas import ChatCompletionRequest, CompletionRequest
from gateway.serving.tokenize import StopStringFilter
from gateway.serving.turn.branch import conversation_branch_id, parse_branch_headers
from gateway.serving.turn.fields import field_path
from gateway.serving.turn.lean import TextAssembler

MSG = [{"role": "user", "content": "hi"}]


def test_agent_sdk_request_parses_with_its_no_effect_fields():
    req = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [
                {"role": "developer", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "get", "arguments": '{"x":1}'}}
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            ],
            "tools": [{"type": "function", "function": {"name": "get", "parameters": {}}}],
            "tool_choice": "auto",
            "max_completion_tokens": 5,
            "seed": 3,
            "stop": "\n\n",
            "parallel_tool_calls": True,
            "user": "u",
            "metadata": {"a": "b"},
            "presence_penalty": 0,
        }
    )
    assert req.include_usage and req.requested_max_tokens() == 5 and req.stop_list() == ["\n\n"]
    dicts = [m.chat_message() for m in req.messages]  # as sent: vLLM's parsing flattens them (test_chat_render)
    assert dicts[0]["role"] == "developer"
    assert dicts[2]["tool_calls"][0]["function"]["name"] == "get" and "content" not in dicts[2]
    assert dicts[3]["tool_call_id"] == "c1"


TOOL = {"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}}


@pytest.mark.parametrize(
    "bad",
    [
        {"n": 0},
        {"n": 129},
        {"temperature": 3},
        {"top_p": 0},
        {"max_tokens": 0},
        {"presence_penalty": 2.5},
        {"frequency_penalty": -3},
        {"repetition_penalty": 0},
        {"top_k": -2},
        {"min_p": 1.5},
        {"min_tokens": -1},
        {"stop_token_ids": [-1]},
        {"logit_bias": {"a": 1}},
        {"logit_bias": {"1": 101}},
        {"logprobs": True, "top_logprobs": 21},
        {"top_logprobs": 2},
        {"tools": []},
        {"tools": [{"type": "function", "function": {"name": "bad name"}}]},
        {"tools": [{"type": "custom", "custom": {"name": "x"}}]},
        {"tool_choice": "bogus", "tools": [TOOL]},
        {"tool_choice": "required"},
        {"tool_choice": {"type": "function", "function": {"name": "other"}}, "tools": [TOOL]},
        {"response_format": {"type": "bogus"}},
        {"response_format": {"type": "json_schema"}},
        {"response_format": {"type": "json_object", "json_schema": {"name": "x"}}},
        {"stream_options": {"include_usage": True}},
        {"chat_template_kwargs": {"messages": []}},
        {"messages": []},
        {"messages": [{"role": "wizard", "content": "x"}]},
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        {"stop": ["x"] * 17},
        {"seed": -1},
        {"functions": [{"name": "f"}]},
        {"no_such_field": 1},
    ],
)
def test_invalid_chat_requests_are_rejected(bad):
    with pytest.raises(ValidationError):
        ChatCompletionRequest.model_validate({"model": "m", "messages": MSG, **bad})


def test_refused_fields_are_named_in_the_error():
    body = b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "functions": []}'
    with pytest.raises(InvalidRequest) as err:
        parse_model(ChatCompletionRequest, body)
    assert err.value.param == "functions" and "tools" in err.value.message
    with pytest.raises(InvalidRequest) as err:
        parse_model(ChatCompletionRequest, b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "zz": 1}')
    assert err.value.param == "zz" and err.value.message == "Unrecognized request argument supplied: zz"
    with pytest.raises(InvalidRequest) as err:
        parse_model(ChatCompletionRequest, b'{"model": "m", "messages": [{"role": "user"}], "tool_choice": "x"}')
    assert err.value.param == "tool_choice"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": [TOOL], "tool_choice": "bogus"}, "tool_choice"),  # union tags left out of the path
        ({"tools": [TOOL], "tool_choice": {"type": "function"}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),  # model-level checks name their field
        ({"tools": []}, "tools"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
    ],
)
def test_errors_name_the_field_the_client_sent(body: dict, param: str) -> None:
    raw = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}], **body}).encode()
    with pytest.raises(InvalidRequest) as err:
        parse_model(ChatCompletionRequest, raw)
    assert err.value.param == param, err.value.message


def test_field_path_and_model_check_param() -> None:
    assert field_path(("tools", 0, "FunctionTool", "function", "name")) == "tools.0.function.name"
    assert field_path(("tool_choice", "literal['none','auto']")) == "tool_choice"
    assert field_path(("prompt", "list[int]", 0)) == "prompt.0"
    assert model_check_param("`tool_choice` needs `tools`", {"tool_choice": 1}) == "tool_choice"
    assert model_check_param("chat_template_kwargs may not set x", {"chat_template_kwargs": 1}) == (
        "chat_template_kwargs"
    )
    assert model_check_param("the body is odd", {"model": 1}) is None


def test_sampling_fields_are_kept_for_the_worker():
    req = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": MSG,
            "n": 3,
            "logprobs": True,
            "top_logprobs": 2,
            "logit_bias": {"7": -100, "9": 5.5},
            "top_k": 4,
            "min_p": 0.1,
            "repetition_penalty": 1.2,
            "stop_token_ids": [3],
            "ignore_eos": True,
            "min_tokens": 2,
            "tools": [TOOL],
            "tool_choice": {"type": "function", "function": {"name": "get"}},
            "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}}},
        }
    )
    assert req.logit_bias_ids() == {7: -100, 9: 5.5} and req.n == 3 and req.top_logprobs == 2
    assert req.response_format is not None and req.response_format.json_schema is not None
    assert req.response_format.json_schema.schema_ == {"type": "object"}


def test_completion_request_variants():
    assert CompletionRequest.model_validate({"model": "m", "prompt": "x"}).max_tokens == 16
    assert CompletionRequest.model_validate({"model": "m", "prompt": [1, 2, 3]}).prompt == [1, 2, 3]
    bads: list[dict[str, Any]] = [{"prompt": []}, {"prompt": ["a", "b"]}, {"prompt": "x", "echo": True}]
    for bad in [*bads, {"prompt": "x", "best_of": 2}]:
        with pytest.raises(ValidationError):
            CompletionRequest.model_validate({"model": "m", **bad})


def test_branch_headers():
    b = parse_branch_headers("t1", branch_id="agent.1:sub-2", parent_id="agent.1", session_id="s", finished=None)
    assert b.key == "t1/agent.1:sub-2" and b.parent_key == "t1/agent.1" and not b.finish_at_end
    assert parse_branch_headers("t1", branch_id="b", parent_id=None, session_id=None, finished="true").finish_at_end
    one = parse_branch_headers("t1", branch_id=None, parent_id=None, session_id=None, finished=None)
    assert one.finish_at_end and one.key.startswith("t1/req-")


def test_a_conversation_id_names_the_branch_when_no_header_does():
    conv = parse_branch_headers(
        "t1", branch_id=None, parent_id=None, session_id=None, finished=None, conversation="thread / 42"
    )
    assert conv.branch_id == conversation_branch_id("thread / 42") and conv.branch_id.startswith("conv-")
    assert not conv.one_shot and not conv.finish_at_end  # lives until its idle TTL
    header = parse_branch_headers(
        "t1", branch_id="mine", parent_id=None, session_id=None, finished=None, conversation="thread / 42"
    )
    assert header.branch_id == "mine"


@pytest.mark.parametrize("bad", ["a/b", "x" * 129, "a b", "a\r\nX-Evil: 1", "ü"])
def test_branch_ids_are_validated(bad):
    with pytest.raises(InvalidRequest):
        parse_branch_headers("t", branch_id=bad, parent_id=None, session_id=None, finished=None)


def test_branch_finished_flag_is_validated():
    with pytest.raises(InvalidRequest):
        parse_branch_headers("t", branch_id="b", parent_id=None, session_id=None, finished="maybe")


def test_stop_filter_catches_stops_spanning_deltas():
    f = StopStringFilter(["END"])
    out = f.push("abcE") + f.push("N") + f.push("Dxyz")
    assert out == "abc" and f.stopped and f.push("more") == "" and f.matched == "END"
    g = StopStringFilter(["END"])
    assert g.push("abcdef") + g.flush() == "abcdef"
    assert StopStringFilter([]).push("x") == "x"


def test_detokenizer_streams_the_same_text_as_a_full_decode(tokenizer):
    text = "héllo wörld — ünïcode ✓ 日本語 def fibonacci(n): return n"
    ids = tokenizer.encode_text(text, add_special_tokens=False)
    asm = TextAssembler(tokenizer, [])
    pieces = [asm.push([i]) for i in ids] + [asm.flush()]
    assert "".join(pieces) == tokenizer.decode(ids) == text
    assert all("\ufffd" not in p for p in pieces)


def test_text_assembler_applies_stop_strings(tokenizer):
    ids = tokenizer.encode_text("one two three four", add_special_tokens=False)
    asm = TextAssembler(tokenizer, [" three"])
    out = "".join(asm.push([i]) for i in ids) + asm.flush()
    assert out == "one two" and asm.stopped
