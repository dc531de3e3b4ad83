"""context_management edits on literal conversations (pure)."""

from __future__ import annotations

import pytest

from gateway.http.errors import InvalidRequest
from gateway.serving.anthropic.context_edits import CLEARED, apply_edits


def words(text: str) -> int:  # a stand-in tokenizer: one token per word
    return len(text.split())


def thinking_turn(n: int) -> dict:
    return {
        "role": "assistant",
        "content": [{"type": "thinking", "thinking": f"t{n}", "signature": "s"}, {"type": "text", "text": f"a{n}"}],
    }


CONVERSATION = [
    {"role": "user", "content": "q1"},
    thinking_turn(1),
    {"role": "user", "content": "q2"},
    thinking_turn(2),
    {"role": "user", "content": "q3"},
    thinking_turn(3),
]


def kinds(message: dict) -> list[str]:
    return [b["type"] for b in message["content"]]


def test_claude_codes_default_edit_keeps_all_thinking() -> None:
    cm = {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}
    out, applied = apply_edits(CONVERSATION, cm, words)
    assert out == CONVERSATION and applied.edits == []


def test_clear_thinking_keeps_the_last_turns() -> None:
    cm = {"edits": [{"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 2}}]}
    out, applied = apply_edits(CONVERSATION, cm, words)
    assert [kinds(m) for m in out[1::2]] == [["text"], ["thinking", "text"], ["thinking", "text"]]
    assert applied.edits == [{"type": "clear_thinking_20251015", "cleared_thinking_turns": 1}]
    assert kinds(CONVERSATION[1]) == ["thinking", "text"]  # the input is not changed
    default, _ = apply_edits(CONVERSATION, {"edits": [{"type": "clear_thinking_20251015"}]}, words)
    assert [kinds(m) for m in default[1::2]] == [["text"], ["text"], ["thinking", "text"]]


def tool_round(n: int, name: str = "Bash") -> list[dict]:
    return [
        {"role": "assistant", "content": [{"type": "tool_use", "id": f"u{n}", "name": name, "input": {"c": n}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"u{n}", "content": "out " * 10}]},
    ]


TOOLS = [{"role": "user", "content": "go"}, *tool_round(1), *tool_round(2, "Read"), *tool_round(3), *tool_round(4)]


def results(messages: list[dict]) -> list[str]:
    return [b["content"] for m in messages for b in m["content"] if isinstance(b, dict) and b["type"] == "tool_result"]


def test_clear_tool_uses_past_the_trigger_keeps_the_last_and_the_excluded() -> None:
    edit = {
        "type": "clear_tool_uses_20250919",
        "trigger": {"type": "tool_uses", "value": 3},
        "keep": {"type": "tool_uses", "value": 1},
        "exclude_tools": ["Read"],
        "clear_tool_inputs": True,
    }
    out, applied = apply_edits(TOOLS, {"edits": [edit]}, words)
    assert [r == CLEARED for r in results(out)] == [True, False, True, False]
    assert out[1]["content"][0]["input"] == {} and out[3]["content"][0]["input"] == {"c": 2}
    assert applied.edits[0]["cleared_tool_uses"] == 2 and applied.edits[0]["cleared_input_tokens"] == 20


def test_clear_tool_uses_below_its_trigger_or_minimum_changes_nothing() -> None:
    below = {"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 10_000}}
    assert apply_edits(TOOLS, {"edits": [below]}, words)[0] == TOOLS
    small = {
        "type": "clear_tool_uses_20250919",
        "trigger": {"type": "tool_uses", "value": 1},
        "clear_at_least": {"type": "input_tokens", "value": 500},
    }
    assert apply_edits(TOOLS, {"edits": [small]}, words)[0] == TOOLS


@pytest.mark.parametrize(
    ("cm", "param"),
    [
        ({"edits": [{"type": "compact_20260101"}]}, "context_management.edits.0.type"),
        ({"edits": "all"}, "context_management.edits"),
        (
            {"edits": [{"type": "clear_thinking_20251015", "keep": {"type": "turns", "value": 1}}]},
            "context_management.edits.0.keep",
        ),
    ],
)
def test_unknown_or_malformed_edits_are_refused(cm: dict, param: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        apply_edits(TOOLS, cm, words)
    assert err.value.param == param
