"""Anthropic `context_management` edits, applied to the conversation before
it is templated (pure: plain JSON in, plain JSON out).

Claude Code sends `{"edits": [{"type": "clear_thinking_20251015", ...}]}`
by default; the Messages API applies such edits server-side, so the gateway
does too, on the request's own messages:

- `clear_thinking_20251015`: thinking blocks (`thinking`,
  `redacted_thinking`) are removed from every assistant turn but the last
  `keep.value` turns that have any (`keep`: `{"type": "thinking_turns",
  "value": N}`, default 1; `"all"` keeps every one).
- `clear_tool_uses_20250919`: once the prompt passes `trigger`
  (`{"type": "input_tokens", "value": N}`, default 100,000 tokens, or
  `{"type": "tool_uses", "value": N}`), the results of the oldest tool uses
  are replaced by a short placeholder, keeping the last `keep.value`
  (`{"type": "tool_uses"}`, default 3) and any tool named in
  `exclude_tools`; `clear_tool_inputs` (true, or a list of names) also
  empties those calls' inputs; `clear_at_least` (`input_tokens`) skips the
  edit when it would free fewer tokens than that.

Token counts come from `count_tokens(text)`, the caller's tokenizer.
Unknown edit types are refused (400 naming the edit), never skipped.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gateway.http.errors import InvalidRequest

CLEAR_THINKING = "clear_thinking_20251015"
CLEAR_TOOL_USES = "clear_tool_uses_20250919"
CLEARED = "[tool result cleared to save context]"
THINKING_BLOCKS = ("thinking", "redacted_thinking")


@dataclass
class AppliedEdits:
    """What the edits did (Anthropic reports it back as `context_management.applied_edits`)."""

    edits: list[dict[str, Any]] = field(default_factory=list)


def _param(i: int, name: str = "") -> str:
    return f"context_management.edits.{i}" + (f".{name}" if name else "")


def _count(value: Any, i: int, name: str, kinds: tuple[str, ...], default: tuple[str, int]) -> tuple[str, int]:
    if value is None:
        return default
    if not isinstance(value, dict) or value.get("type") not in kinds or not isinstance(value.get("value"), int):
        raise InvalidRequest(
            f"`{name}` must be an object with type in {kinds} and an integer value", param=_param(i, name)
        )
    if value["value"] < 0:
        raise InvalidRequest(f"`{name}.value` must be >= 0", param=_param(i, name))
    return value["type"], value["value"]


def _blocks(message: dict[str, Any]) -> list[Any]:
    content = message.get("content")
    return content if isinstance(content, list) else []


def clear_thinking(messages: list[dict[str, Any]], edit: dict[str, Any], i: int) -> dict[str, Any] | None:
    keep = edit.get("keep")
    if keep == "all":
        return None
    _, turns = _count(keep, i, "keep", ("thinking_turns",), ("thinking_turns", 1))
    with_thinking = [
        m
        for m in messages
        if m.get("role") == "assistant"
        and any(isinstance(b, dict) and b.get("type") in THINKING_BLOCKS for b in _blocks(m))
    ]
    older = with_thinking[: max(0, len(with_thinking) - turns)]
    for m in older:
        kept = [b for b in _blocks(m) if not (isinstance(b, dict) and b.get("type") in THINKING_BLOCKS)]
        m["content"] = kept or [{"type": "text", "text": ""}]
    return {"type": CLEAR_THINKING, "cleared_thinking_turns": len(older)} if older else None


def _tool_uses(messages: list[dict[str, Any]]) -> list[tuple[dict[str, Any], str]]:
    """Every tool_use block in order, with its tool name."""
    return [
        (b, str(b.get("name", "")))
        for m in messages
        if m.get("role") == "assistant"
        for b in _blocks(m)
        if isinstance(b, dict) and b.get("type") == "tool_use"
    ]


def _results_by_id(messages: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        str(b.get("tool_use_id")): b
        for m in messages
        if m.get("role") == "user"
        for b in _blocks(m)
        if isinstance(b, dict) and b.get("type") == "tool_result"
    }


def _text_of(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def clear_tool_uses(
    messages: list[dict[str, Any]], edit: dict[str, Any], i: int, count_tokens: Callable[[str], int]
) -> dict[str, Any] | None:
    trigger_kind, trigger = _count(
        edit.get("trigger"), i, "trigger", ("input_tokens", "tool_uses"), ("input_tokens", 100_000)
    )
    _, keep = _count(edit.get("keep"), i, "keep", ("tool_uses",), ("tool_uses", 3))
    _, at_least = _count(edit.get("clear_at_least"), i, "clear_at_least", ("input_tokens",), ("input_tokens", 0))
    exclude = set(edit.get("exclude_tools") or [])
    inputs = edit.get("clear_tool_inputs") or False
    uses = _tool_uses(messages)
    measure = len(uses) if trigger_kind == "tool_uses" else count_tokens(_text_of(messages))
    if measure <= trigger:
        return None
    results = _results_by_id(messages)
    candidates = [(use, name) for use, name in uses[: max(0, len(uses) - keep)] if name not in exclude]
    freed = sum(
        count_tokens(_text_of(results[str(u.get("id"))].get("content", "")))
        for u, _ in candidates
        if str(u.get("id")) in results
    )
    if not candidates or freed < at_least:
        return None
    for use, name in candidates:
        result = results.get(str(use.get("id")))
        if result is not None:
            result["content"] = CLEARED
        if inputs is True or (isinstance(inputs, list) and name in inputs):
            use["input"] = {}
    return {"type": CLEAR_TOOL_USES, "cleared_tool_uses": len(candidates), "cleared_input_tokens": freed}


def apply_edits(
    messages: list[dict[str, Any]], context_management: Any, count_tokens: Callable[[str], int]
) -> tuple[list[dict[str, Any]], AppliedEdits]:
    """The messages after the edits (a copy; the input is not changed)."""
    if context_management is None:
        return messages, AppliedEdits()
    edits = context_management.get("edits") if isinstance(context_management, dict) else None
    if not isinstance(edits, list):
        raise InvalidRequest("`context_management.edits` must be a list", param="context_management.edits")
    out = copy.deepcopy(messages)
    applied = AppliedEdits()
    for i, edit in enumerate(edits):
        kind = edit.get("type") if isinstance(edit, dict) else None
        if kind == CLEAR_THINKING:
            done = clear_thinking(out, edit, i)
        elif kind == CLEAR_TOOL_USES:
            done = clear_tool_uses(out, edit, i, count_tokens)
        else:
            raise InvalidRequest(f"context management edit type {kind!r} is not supported", param=_param(i, "type"))
        if done is not None:
            applied.edits.append(done)
    return out, applied
