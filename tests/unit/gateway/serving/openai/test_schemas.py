"""OpenAI request validation, branch headers, tool-call parsing, text assembly."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gateway.errors import InvalidRequest
from gateway.serving.openai.schemas import ChatCompletionRequest, CompletionRequest
from gateway.serving.openai.service import TextAssembler, parse_branch_headers, parse_tool_calls
from gateway.serving.tokenize import StopStringFilter

MSG = [{"role": "user", "content": "hi"}]


def test_agent_sdk_request_parses_and_ignores_unknown_fields():
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
    dicts = [m.template_dict() for m in req.messages]
    assert dicts[0] == {"role": "system", "content": "be brief"}
    assert dicts[1]["content"] == "weather?"
    assert dicts[2]["tool_calls"][0]["function"]["name"] == "get" and dicts[2]["content"] == ""
    assert dicts[3]["tool_call_id"] == "c1"


@pytest.mark.parametrize(
    "bad",
    [
        {"n": 2},
        {"n": 0},
        {"temperature": 3},
        {"top_p": 0},
        {"max_tokens": 0},
        {"logprobs": True},
        {"messages": []},
        {"messages": [{"role": "wizard", "content": "x"}]},
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        {"stop": ["x"] * 17},
        {"seed": -1},
    ],
)
def test_invalid_chat_requests_are_rejected(bad):
    with pytest.raises(ValidationError):
        ChatCompletionRequest.model_validate({"model": "m", "messages": MSG, **bad})


def test_completion_request_variants():
    assert CompletionRequest.model_validate({"model": "m", "prompt": "x"}).max_tokens == 16
    assert CompletionRequest.model_validate({"model": "m", "prompt": [1, 2, 3]}).prompt == [1, 2, 3]
    for bad in ({"prompt": []}, {"prompt": ["a", "b"]}, {"prompt": "x", "echo": True}, {"prompt": "x", "best_of": 2}):
        with pytest.raises(ValidationError):
            CompletionRequest.model_validate({"model": "m", **bad})


def test_branch_headers():
    b = parse_branch_headers("t1", branch_id="agent.1:sub-2", parent_id="agent.1", session_id="s", finished=None)
    assert b.key == "t1/agent.1:sub-2" and b.parent_key == "t1/agent.1" and not b.finish_at_end
    assert parse_branch_headers("t1", branch_id="b", parent_id=None, session_id=None, finished="true").finish_at_end
    one = parse_branch_headers("t1", branch_id=None, parent_id=None, session_id=None, finished=None)
    assert one.finish_at_end and one.key.startswith("t1/req-")


@pytest.mark.parametrize("bad", ["a/b", "x" * 129, "a b", "a\r\nX-Evil: 1", "ü"])
def test_branch_ids_are_validated(bad):
    with pytest.raises(InvalidRequest):
        parse_branch_headers("t", branch_id=bad, parent_id=None, session_id=None, finished=None)


def test_branch_finished_flag_is_validated():
    with pytest.raises(InvalidRequest):
        parse_branch_headers("t", branch_id="b", parent_id=None, session_id=None, finished="maybe")


def test_tool_calls_are_parsed_out_of_text():
    text = 'ok <tool_call>{"name": "get", "arguments": {"city": "Paris"}}</tool_call>'
    content, calls = parse_tool_calls(text)
    assert content == "ok" and calls[0].function.name == "get"
    assert calls[0].function.arguments == '{"city": "Paris"}'
    assert parse_tool_calls("<tool_call>not json</tool_call>") == ("<tool_call>not json</tool_call>", [])


def test_stop_filter_catches_stops_spanning_deltas():
    f = StopStringFilter(["END"])
    out = f.push("abcE") + f.push("N") + f.push("Dxyz")
    assert out == "abc" and f.stopped and f.push("more") == ""
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


def test_chat_template_renders_tools_and_roles(tokenizer):
    msgs = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
        {"role": "tool", "content": "res", "tool_call_id": "1"},
    ]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    text = tokenizer.render_chat(msgs, tools=tools)
    assert text.startswith("<|begin_of_text|>") and "You can call these tools" in text
    assert text.endswith("<|start_header|>assistant<|end_header|>\n")
    ids = tokenizer.encode_chat(msgs, tools=tools)
    assert ids[0] == tokenizer._hf.bos_token_id and ids.count(ids[0]) == 1
