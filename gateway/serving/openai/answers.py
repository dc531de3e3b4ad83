"""Chat and completions answers: the JSON of a non-streamed answer, and the
chunks of a streamed one beyond plain text (tool calls, structured outputs,
reasoning, `n` choices, logprobs).

Chunks carry `tool_calls` deltas as OpenAI sends them (index, then
id/type/name once, then argument fragments), `logprobs` per token, one role
chunk and one finish chunk per choice, and the usage chunk last.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import Response

from gateway.serving.openai import sse
from gateway.serving.openai.schemas import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChoiceLogprobs,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    FunctionCall,
    TokenLogprob,
    ToolCall,
    TopLogprob,
    Usage,
)
from gateway.serving.turn.choices import ChoiceDelta, ChoiceResult, LogprobEntry
from gateway.serving.turn.prepare import Prepared


def chat_logprobs(entries: list[LogprobEntry]) -> ChoiceLogprobs:
    return ChoiceLogprobs(
        content=[
            TokenLogprob(
                token=e.token,
                logprob=e.logprob,
                bytes=e.bytes,
                top_logprobs=[TopLogprob(token=t.token, logprob=t.logprob, bytes=t.bytes) for t in e.top],
            )
            for e in entries
        ]
    )


def completion_logprobs(entries: list[LogprobEntry], offset: int = 0) -> CompletionLogprobs:
    out = CompletionLogprobs()
    for e in entries:
        out.tokens.append(e.token)
        out.token_logprobs.append(e.logprob)
        out.top_logprobs.append({t.token: t.logprob for t in e.top})
        out.text_offset.append(offset)
        offset += len(e.token)
    return out


def _tool_calls(calls: list[Any]) -> list[ToolCall] | None:
    from gateway.serving.turn.parsing import new_tool_call_id

    if not calls:
        return None
    return [
        ToolCall(id=c.id or new_tool_call_id(), function=FunctionCall(name=c.name, arguments=c.arguments))
        for c in calls
    ]


class ChunkWriter:
    """Chunk bytes of one streamed answer (chat or completions)."""

    def __init__(self, p: Prepared, model: str, *, chat: bool) -> None:
        self._head = {"id": p.request_id, "object": "chat.completion.chunk" if chat else "text_completion"}
        self._tail = {"created": p.created, "model": model}
        self._chat = chat
        self._offsets: dict[int, int] = {}

    def _event(self, choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> bytes:
        body = {**self._head, **self._tail, "choices": choices}
        if usage is not None:
            body["usage"] = usage
        return sse.event(json.dumps(body, separators=(",", ":"), ensure_ascii=False))

    def role(self, index: int, usage: dict[str, Any] | None = None) -> bytes:
        return self._event([{"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None}], usage)

    def delta(self, d: ChoiceDelta) -> bytes | None:
        if self._chat:
            delta: dict[str, Any] = {}
            if d.reasoning:
                delta["reasoning"] = d.reasoning
            if d.content:
                delta["content"] = d.content
            if d.tool_calls:
                delta["tool_calls"] = d.tool_call_dicts()
            lp = chat_logprobs(d.logprobs).model_dump() if d.logprobs else None
            if not delta and lp is None and d.finish_reason is None:
                return None
            choice = {"index": d.index, "delta": delta, "logprobs": lp, "finish_reason": d.finish_reason}
            if d.stop_string is not None:
                choice["stop_reason"] = d.stop_string  # vLLM's field: the stop string that matched
        else:
            offset = self._offsets.get(d.index, 0)
            lp = completion_logprobs(d.logprobs, offset).model_dump() if d.logprobs else None
            self._offsets[d.index] = offset + sum(len(e.token) for e in d.logprobs)
            if not d.text and lp is None and d.finish_reason is None:
                return None
            choice = {"index": d.index, "text": d.text, "logprobs": lp, "finish_reason": d.finish_reason}
        return self._event([choice])

    def usage(self, usage: dict[str, Any]) -> bytes:
        return self._event([], usage)


def full_answer(
    p: Prepared,
    model: str,
    *,
    chat: bool,
    usage: Usage,
    choices: list[ChatChoice] | list[CompletionChoice],
    headers: dict[str, str],
) -> Response:
    """A non-streamed answer as JSON: a ChatCompletion around `ChatChoice`s
    (`chat`) or a Completion around `CompletionChoice`s. Plain requests
    (routes.py) build their one choice and usage from the lean path's text,
    the others from their `ChoiceResult`s (`chat_choices`, `completion_choices`)."""
    fields: dict[str, Any] = {
        "id": p.request_id,
        "created": p.created,
        "model": model,
        "usage": usage,
        "choices": choices,
    }
    out = ChatCompletion(**fields) if chat else Completion(**fields)
    return Response(out.model_dump_json(), media_type="application/json", headers=headers)


def chat_choices(p: Prepared, results: list[ChoiceResult]) -> list[ChatChoice]:
    choices = []
    for r in results:
        calls = _tool_calls(r.tool_calls)
        content = r.content if not calls else (r.content or None)
        choices.append(
            ChatChoice(
                index=r.index,
                message=AssistantMessage(content=content, tool_calls=calls, reasoning=r.reasoning),
                logprobs=chat_logprobs(r.logprobs) if p.logprobs is not None else None,
                finish_reason=r.finish_reason,
            )
        )
    return choices


def completion_choices(p: Prepared, results: list[ChoiceResult]) -> list[CompletionChoice]:
    return [
        CompletionChoice(
            index=r.index,
            text=r.text,
            logprobs=completion_logprobs(r.logprobs) if p.logprobs is not None else None,
            finish_reason=r.finish_reason,
        )
        for r in results
    ]
