"""Anthropic stream events from the turn's deltas (anthropic/events.py), held
against vLLM's own converter (`message_stream_converter`) fed the same turn
as chat-completion chunks: the same events, in the same order."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from core import FinishReason, Phase
from gateway.serving.anthropic.events import MessageEvents
from gateway.serving.jobs import Finished, Job
from gateway.serving.policy.tenancy import TenantContext
from gateway.serving.turn.branch import parse_branch_headers
from gateway.serving.turn.choices import ChoiceDelta
from gateway.serving.turn.prepare import Prepared
from workers.protocol import SamplingOptions

pytest.importorskip("vllm")
from vllm.entrypoints.anthropic.serving import AnthropicServingMessages
from vllm.entrypoints.generate.base.protocol import DeltaFunctionCall, DeltaMessage, DeltaToolCall

PROMPT = [1, 2, 3, 4, 5]


def _prepared() -> Prepared:
    branch = parse_branch_headers("t", branch_id=None, parent_id=None, session_id=None, finished=None)
    job = Job("msg-1", PROMPT, SamplingOptions(max_tokens=8), "salt", branch.key)
    return Prepared("msg-1", 0, TenantContext(tenant_id="t", name="t", cache_salt="t"), branch, job, [], False)


def _chunks(deltas: list[ChoiceDelta], done: Finished) -> list[str]:
    """The turn as the chat-completion chunks vLLM's converter reads."""
    head = {"id": "msg-1", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    prompt = len(PROMPT)
    out = [
        {
            **head,
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": 0, "total_tokens": prompt},
        }
    ]
    for d in deltas:
        delta: dict[str, Any] = {}
        if d.reasoning:
            delta["reasoning"] = d.reasoning
        if d.content:
            delta["content"] = d.content
        if d.tool_calls:
            delta["tool_calls"] = d.tool_call_dicts()
        choice = {"index": 0, "delta": delta, "finish_reason": d.finish_reason}
        if d.stop_string is not None:
            choice["stop_reason"] = d.stop_string
        out.append({**head, "choices": [choice]})
    usage = {
        "prompt_tokens": done.prompt_tokens,
        "completion_tokens": done.completion_tokens,
        "total_tokens": done.prompt_tokens + done.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": done.cached_tokens},
    }
    out.append({**head, "choices": [], "usage": usage})
    return [f"data: {json.dumps(c)}\n\n" for c in out] + ["data: [DONE]\n\n"]


def _parse(stream: str) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for block in stream.strip().split("\n\n"):
        kind, data = block.split("\n", 1)
        body = json.loads(data.removeprefix("data: "))
        if body.get("delta", {}).get("type") == "signature_delta":
            body["delta"]["signature"] = "<random>"
        events.append((kind.removeprefix("event: "), body))
    return events


async def _ours(deltas: list[ChoiceDelta]) -> str:
    async def source() -> AsyncIterator[ChoiceDelta]:
        for d in deltas:
            yield d

    return b"".join([e async for e in MessageEvents(_prepared(), "m").events(source())]).decode()


async def _vllms(deltas: list[ChoiceDelta], done: Finished) -> str:
    async def source() -> AsyncIterator[str]:
        for c in _chunks(deltas, done):
            yield c

    # vLLM's converter is an unbound method here: no serving object is needed for it.
    converter = AnthropicServingMessages.message_stream_converter(None, source())  # type: ignore[arg-type]
    return "".join([e async for e in converter])


def _msg(**kw: Any) -> ChoiceDelta:
    finished = kw.pop("finished", None)
    extra = {k: kw.pop(k) for k in ("finish_reason", "stop_string") if k in kw}
    return ChoiceDelta(0, message=DeltaMessage(**kw), parsed=True, finished=finished, **extra)


def _call(index: int, *, id: str | None = None, name: str | None = None, args: str | None = None) -> DeltaToolCall:
    return DeltaToolCall(
        index=index, id=id, type="function" if id else None, function=DeltaFunctionCall(name=name, arguments=args)
    )


DONE = Finished(FinishReason.STOP, len(PROMPT), 2, 6, 0.0, 0.0, Phase.DECODE)
CASES = {
    "text": [
        ChoiceDelta(0, text="Hel"),
        ChoiceDelta(0, text="lo"),
        ChoiceDelta(0, finished=DONE, finish_reason="stop"),
    ],
    "stop string": [
        ChoiceDelta(0, text="a"),
        ChoiceDelta(0, text="b", finished=DONE, finish_reason="stop", stop_string="END"),
    ],
    "thinking then text": [
        _msg(reasoning="hmm"),
        _msg(reasoning=" ok"),
        _msg(content="Paris"),
        _msg(finished=DONE, finish_reason="stop"),
    ],
    "text then tools": [
        _msg(content="Let me look."),
        _msg(tool_calls=[_call(0, id="call_1", name="ls", args='{"pa')]),
        _msg(tool_calls=[_call(0, args='th": "."}')]),
        _msg(content="held"),
        _msg(tool_calls=[_call(1, id="call_2", name="cat", args="{}")], finished=DONE, finish_reason="tool_calls"),
    ],
    "tool cut short": [
        _msg(tool_calls=[_call(0, id="call_1", name="ls", args='{"pa')]),
        _msg(finished=Finished(FinishReason.LENGTH, 5, 0, 8, 0.0, 0.0, Phase.DECODE), finish_reason="length"),
    ],
}


@pytest.mark.parametrize("case", list(CASES))
async def test_the_events_are_vllms(case: str) -> None:
    deltas = CASES[case]
    done = next(d.finished for d in deltas if d.finished is not None)
    assert _parse(await _ours(deltas)) == _parse(await _vllms(deltas, done))
