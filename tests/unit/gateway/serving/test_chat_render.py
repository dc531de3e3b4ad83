"""Messages reach stock chat templates as vLLM's server gives them
(gateway.serving.chat_render): parts flattened, no None content, tool-call
and tool-result turns, developer/system roles — per API, per template.

The templates are stock ones read from installed packages, never written
here: the demo model's own (SmolLM2-Instruct's ChatML, from its GGUF),
vLLM's ChatML template, and vLLM's MiniCPM-V 4.5 template (Qwen-style
ChatML with a tools section and `<tool_call>` blocks). A stock Llama 3
template ships in no installed package, so it is not among them.
"""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

from gateway.http.errors import InvalidRequest
from gateway.serving.anthropic import convert as anthropic
from gateway.serving.openai.convert import chat_spec
from gateway.serving.openai.schemas import ChatCompletionRequest
from gateway.serving.responses import convert as responses
from gateway.serving.tokenize import PromptTokenizer
from testing.tiny_tokenizer import write_tiny_tokenizer


def _vllm_template(name: str) -> str:
    import vllm

    return (pathlib.Path(vllm.__file__).parent / "transformers_utils" / "chat_templates" / name).read_text()


def _smollm2_template() -> str:
    from workers.demo_model import stock_chat_template

    return stock_chat_template()


TEMPLATES = {
    "smollm2-chatml": _smollm2_template,
    "vllm-chatml": lambda: _vllm_template("template_chatml.jinja"),
    "tools-section": lambda: _vllm_template("template_minicpmv45.jinja"),
}


@pytest.fixture(scope="module", params=sorted(TEMPLATES))
def tokenizer(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> PromptTokenizer:
    from transformers import AutoTokenizer

    folder = write_tiny_tokenizer(tmp_path_factory.mktemp(request.param))
    hf = AutoTokenizer.from_pretrained(str(folder))
    hf.chat_template = TEMPLATES[request.param]()
    return PromptTokenizer(hf, model_dir=str(folder))


CALL = {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": '{"path": "."}'}}
CHAT: list[dict[str, Any]] = [
    {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
    {"role": "user", "content": [{"type": "text", "text": "List the files"}, {"type": "text", "text": "here."}]},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "a.txt\nb.txt"}]},
]


def test_chat_completions_parts_and_tool_turns_render(tokenizer: PromptTokenizer) -> None:
    spec = chat_spec(ChatCompletionRequest.model_validate({"model": "m", "messages": CHAT}))
    text = tokenizer.render_chat(spec.messages or [])
    assert "List the files\nhere." in text  # text parts joined as vLLM joins them
    assert "a.txt\nb.txt" in text and "Be brief." in text
    assert "None" not in text and "[{" not in text  # no raw None, no part lists
    assert text[text.rindex("<|im_start|>") :].startswith("<|im_start|>assistant")  # the generation prompt


def test_conversation_is_what_vllm_hands_the_template(tokenizer: PromptTokenizer) -> None:
    conversation = tokenizer._renderer.conversation(CHAT)
    assistant = conversation[2]
    assert assistant["content"] in ("", [])  # never None
    assert assistant["tool_calls"][0]["function"]["arguments"] == {"path": "."}  # an object for templates
    tool = conversation[3]
    assert tool["content"] == "a.txt\nb.txt" and tool["tool_call_id"] == "call_1"


def test_responses_function_call_output_turn_renders(tokenizer: PromptTokenizer) -> None:
    # The Agents SDK's second turn: the call it got and the tool's output, as input items.
    req = responses.parse_request(
        {
            "model": "m",
            "instructions": "You are an agent.",
            "input": [
                {"role": "developer", "content": [{"type": "input_text", "text": "Use tools."}]},
                {"role": "user", "content": [{"type": "input_text", "text": "How many files?"}]},
                {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "a.txt b.txt"},
            ],
        }
    )
    spec, _ = responses.turn_spec(req, [])
    text = tokenizer.render_chat(spec.messages or [])
    assert "How many files?" in text and "a.txt b.txt" in text and "None" not in text


def test_anthropic_tool_result_and_inline_system_render(tokenizer: PromptTokenizer) -> None:
    body = {
        "model": "m",
        "max_tokens": 64,
        "system": [{"type": "text", "text": "You are Claude Code."}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "list files"}, {"type": "text", "text": "now"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Bash", "input": {"c": "ls"}}]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "x.py"}]}
                ],
            },
            {"role": "system", "content": [{"type": "text", "text": "Reminder: be brief."}]},
        ],
    }
    text = tokenizer.render_chat(anthropic.turn_spec(anthropic.parse_request(body)).messages or [])
    assert "x.py" in text and "Reminder: be brief." in text and "None" not in text
    counted = anthropic.count_tokens_spec(
        anthropic.parse_request({k: v for k, v in body.items() if k != "max_tokens"}, count_tokens=True)
    )
    assert tokenizer.render_chat(counted.messages or []) == text


def test_a_template_error_is_a_400_naming_messages(tokenizer: PromptTokenizer) -> None:
    template = tokenizer._hf.chat_template
    tokenizer._hf.chat_template = "{{ raise_exception('no such role') }}"
    try:
        with pytest.raises(InvalidRequest) as err:
            tokenizer.render_chat([{"role": "user", "content": "hi"}])
        assert err.value.param == "messages" and "no such role" in err.value.message
    finally:
        tokenizer._hf.chat_template = template
