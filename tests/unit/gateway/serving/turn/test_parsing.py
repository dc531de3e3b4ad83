"""The gateway's use of vLLM's tool parser and constraint builders (no engine):
what a request becomes for the worker, and how output text is read back."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.http.errors import InvalidRequest
from gateway.serving.turn.parsing import OutputParsing, chat_request, structured_output

ADD: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def parsing(tokenizer) -> OutputParsing:
    return OutputParsing.create(tokenizer.hf, tool_parser="hermes", reasoning_parser=None, tool_strict_level="auto")


def _req(**fields):
    return chat_request({"model": "m", "messages": MSG, **fields})


def test_required_tool_choice_becomes_a_structural_tag(parsing) -> None:
    adjusted = parsing.adjust(_req(tools=[ADD], tool_choice="required", parallel_tool_calls=False))
    so = adjusted.structured_output
    assert so is not None and so.structural_tag is not None and so.json_schema is None
    fmt = json.loads(so.structural_tag)["format"]
    assert fmt["type"] == "tags_with_separator" and fmt["at_least_one"] and fmt["stop_after_first"]
    assert all(t["begin"].startswith("<tool_call>") and '"add"' in t["begin"] for t in fmt["tags"])
    assert adjusted.parses and not adjusted.forced_tool and not adjusted.skip_special_tokens


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "add"}}])
def test_a_forced_call_holds_a_non_strict_tools_arguments_to_its_schema(parsing, choice) -> None:
    # ADD is not strict: under "auto" vLLM would leave its arguments free (a list was seen)
    so = parsing.adjust(_req(tools=[ADD], tool_choice=choice)).structured_output
    assert so is not None and so.structural_tag is not None
    assert '"required": ["a", "b"]' in so.structural_tag or '"required":["a","b"]' in so.structural_tag


def test_a_named_function_is_forced(parsing) -> None:
    adjusted = parsing.adjust(_req(tools=[ADD], tool_choice={"type": "function", "function": {"name": "add"}}))
    assert adjusted.forced_tool and adjusted.structured_output is not None


def test_auto_without_strict_tools_is_not_constrained(parsing) -> None:
    adjusted = parsing.adjust(_req(tools=[ADD], tool_choice="auto"))
    assert adjusted.structured_output is None and adjusted.parses


def test_auto_with_a_strict_tool_leaves_free_text_and_the_end_of_turn_open(parsing, tokenizer) -> None:
    # The Agents SDK's tools are strict: under "auto" the constraint only holds a call's
    # arguments to the schema once "<tool_call>" is written; an answer may still end anywhere.
    import xgrammar as xgr

    strict = {"type": "function", "function": {**ADD["function"], "strict": True}}
    so = parsing.adjust(_req(tools=[strict], tool_choice="auto")).structured_output
    assert so is not None and so.structural_tag is not None
    fmt = json.loads(so.structural_tag)["format"]
    assert fmt["type"] == "triggered_tags" and fmt["triggers"] == ["<tool_call>"] and not fmt["at_least_one"]
    hf = tokenizer.hf
    info = xgr.TokenizerInfo.from_huggingface(hf, stop_token_ids=[hf.eos_token_id])
    grammar = xgr.GrammarCompiler(info).compile_structural_tag(so.structural_tag)
    for text in ("", "There are 4 files."):
        matcher = xgr.GrammarMatcher(grammar)
        assert all(matcher.accept_token(t) for t in hf.encode(text, add_special_tokens=False))
        assert matcher.accept_token(hf.eos_token_id), text
    # The contrast: a required call cannot end before it.
    forced = parsing.adjust(_req(tools=[strict], tool_choice="required")).structured_output
    assert forced is not None and forced.structural_tag is not None
    matcher = xgr.GrammarMatcher(xgr.GrammarCompiler(info).compile_structural_tag(forced.structural_tag))
    assert not matcher.accept_token(hf.eos_token_id)


def test_tool_choice_none_neither_constrains_nor_parses(parsing) -> None:
    adjusted = parsing.adjust(_req(tools=[ADD], tool_choice="none"))
    assert adjusted.structured_output is None and not adjusted.parses


def test_response_format_becomes_the_json_constraint(parsing) -> None:
    schema = {"type": "object", "properties": {"x": {"type": "string"}}}
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": False}}
    adjusted = parsing.adjust(_req(response_format=rf))
    assert adjusted.structured_output is not None and adjusted.structured_output.json_schema == schema
    assert not adjusted.parses  # plain content, constrained
    obj = parsing.adjust(_req(response_format={"type": "json_object"}))
    assert obj.structured_output is not None and obj.structured_output.json_object


def test_hermes_output_is_read_back_into_calls(parsing) -> None:
    adjusted = parsing.adjust(_req(tools=[ADD], tool_choice="auto"))
    parser = adjusted.new_parser()
    text = 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    _reasoning, content, calls = parser.parse(text, adjusted.request, enable_auto_tools=True)
    assert content == "Let me add.\n" and calls[0].name == "add" and json.loads(calls[0].arguments) == {"a": 1, "b": 2}


def test_hermes_streams_content_then_the_call(parsing, tokenizer) -> None:
    adjusted = parsing.adjust(_req(tools=[ADD], tool_choice="auto", stream=True))
    parser = adjusted.new_parser()
    text = 'ok <tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    content, args, names = "", "", []
    pieces = [text[i : i + 3] for i in range(0, len(text), 3)]
    for i, piece in enumerate(pieces):
        delta = parser.parse_delta(piece, [], adjusted.request, prompt_token_ids=[1], finished=i == len(pieces) - 1)
        if delta is None:
            continue
        content += delta.content or ""
        for tc in delta.tool_calls:
            if tc.function is not None:
                names += [tc.function.name] if tc.function.name else []
                args += tc.function.arguments or ""
    assert content.strip() == "ok" and names == ["add"] and json.loads(args) == {"a": 1, "b": 2}


def test_vllms_validation_errors_name_the_field(parsing) -> None:
    with pytest.raises(InvalidRequest) as err:
        _req(tools=[ADD], tool_choice={"type": "function", "function": {"name": "nope"}})
    assert err.value.param == "tool_choice"
    no_parser = OutputParsing.create(parsing._tokenizer, tool_parser=None, reasoning_parser=None)
    with pytest.raises(InvalidRequest) as err:
        no_parser.adjust(_req(tools=[ADD], tool_choice="required"))
    assert err.value.param == "tool_choice" and "tool-call parser" in err.value.message


def test_an_unknown_parser_fails_at_start(tokenizer) -> None:
    with pytest.raises(ValueError, match="tool_parser:'no-such-parser' which has not been registered"):
        OutputParsing.create(tokenizer.hf, tool_parser="no-such-parser", reasoning_parser=None)


def test_structured_output_mapping() -> None:
    from vllm.sampling_params import StructuredOutputsParams

    assert structured_output(None) is None
    spec = structured_output(StructuredOutputsParams(json='{"type": "object"}'))
    assert spec is not None and spec.json_schema == {"type": "object"}
    spec = structured_output(StructuredOutputsParams(choice=["a", "b"]))
    assert spec is not None and spec.choice == ["a", "b"]
