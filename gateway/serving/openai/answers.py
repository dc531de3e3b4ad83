"""Chat and completions answers beyond plain text: tool calls, structured
outputs, reasoning, `n` choices, logprobs (plain requests keep the lean
path in routes.py).

Streams are *primed*: the first worker result is awaited before the
response starts, so a request the model refuses (an invalid JSON schema, a
grammar the backend cannot compile) is a 400, not an error event inside a
200 stream. Chunks carry `tool_calls` deltas as OpenAI sends them (index,
then id/type/name once, then argument fragments), `logprobs` per token,
one role chunk and one finish chunk per choice, and the usage chunk last.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, aclosing
from typing import Any

from fastapi.responses import Response

from gateway.http.errors import GatewayError
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
from gateway.serving.openai.service import OpenAIService, Prepared
from gateway.serving.orchestrator import Finished
from gateway.serving.turn.choices import ChoiceDelta, ChoiceResult, LogprobEntry, run_choices
from gateway.serving.turn.relay import Item, deltas

log = logging.getLogger(__name__)


def usage_of(done: list[Finished]) -> dict[str, Any]:
    """One request's usage over its choices: the prompt once, every choice's output."""
    first = done[0]
    completion = sum(d.completion_tokens for d in done)
    return {
        "prompt_tokens": first.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": first.prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": first.cached_tokens},
    }


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


def tool_call_delta(tc: Any) -> dict[str, Any]:
    """A vLLM `DeltaToolCall` as OpenAI's stream sends it."""
    out: dict[str, Any] = {"index": tc.index}
    if tc.id:
        out["id"] = tc.id
        out["type"] = "function"
    if tc.function is not None:
        fn = {k: v for k, v in (("name", tc.function.name), ("arguments", tc.function.arguments)) if v is not None}
        out["function"] = fn
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
                delta["tool_calls"] = [tool_call_delta(tc) for tc in d.tool_calls]
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


async def _primed(events: AsyncIterator[Item]) -> tuple[Item | None, AsyncIterator[Item]]:
    """The first item (or None: no item at all), and the iterator."""
    try:
        return await events.__anext__(), events
    except StopAsyncIteration:
        return None, events


async def respond(
    service: OpenAIService,
    p: Prepared,
    *,
    stream: bool,
    chat: bool,
    endpoint: str,
    stack: AsyncExitStack,
    headers: dict[str, str],
    stream_response: Callable[[AsyncIterator[bytes], dict[str, str], Callable[[], Awaitable[object]]], Response],
) -> Response:
    """The answer to a non-plain request; `stack` holds its admission."""
    if not stream:
        async with stack:
            results = await collect(service, p, streaming=False)
        service.metrics.observe_request(p.tenant.tenant_id, endpoint, 200)
        usage = Usage.model_validate(usage_of([r.finished for r in results]))
        choices = chat_choices(p, results) if chat else completion_choices(p, results)
        return full_answer(service, p, chat=chat, usage=usage, choices=choices, headers=headers)
    events = run_choices(service, p, streaming=True)
    try:
        first, events = await _primed(events)
    except BaseException:
        await events.aclose()  # type: ignore[attr-defined]
        await stack.aclose()
        raise
    body = _stream(service, p, first, events, chat=chat, endpoint=endpoint, stack=stack)
    return stream_response(body, headers, stack.aclose)


async def _stream(
    service: OpenAIService,
    p: Prepared,
    first: Item | None,
    events: AsyncIterator[Item],
    *,
    chat: bool,
    endpoint: str,
    stack: AsyncExitStack,
) -> AsyncIterator[bytes]:
    writer = ChunkWriter(p, service.model_name, chat=chat)
    status = 200
    done: list[Finished] = []
    try:
        if chat:
            for i in range(len(p.jobs)):
                yield writer.role(i)
        async with aclosing(deltas(first, events)) as relayed:
            async for delta in relayed:
                if delta.finished is not None:
                    done.append(delta.finished)
                chunk = writer.delta(delta)
                if chunk is not None:
                    yield chunk
        if p.include_usage:
            yield writer.usage(usage_of(done))
        yield sse.DONE
    except GatewayError as exc:
        status = exc.status
        log.warning("stream %s failed: %s", p.request_id, exc.message)
        yield sse.error_event(exc.body())
    except Exception as exc:  # reported to the client and logged, never swallowed
        status = 500
        log.exception("stream %s crashed", p.request_id)
        yield sse.error_event(GatewayError(f"internal error: {type(exc).__name__}").body())
    finally:
        await events.aclose()  # type: ignore[attr-defined]
        service.metrics.observe_request(p.tenant.tenant_id, endpoint, status)
        await stack.aclose()


async def collect(service: OpenAIService, p: Prepared, *, streaming: bool = False) -> list[ChoiceResult]:
    """Run every choice to its end; results in choice order."""
    results: dict[int, ChoiceResult] = {}
    events = run_choices(service, p, streaming=streaming)
    try:
        async for out, ev in events:
            if isinstance(ev, Finished):
                results[out.index] = out.result(ev)
    finally:
        await events.aclose()  # type: ignore[attr-defined]
    return [results[i] for i in sorted(results)]


def full_answer(
    service: OpenAIService,
    p: Prepared,
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
        "model": service.model_name,
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
