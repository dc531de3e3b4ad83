"""The OpenAI leaf's stream encoders (gateway.serving.turn.pipeline.StreamEncoder).

`PlainChunks` encodes the lean source of plain requests (text, then one
`Finished`) with the pre-rendered chunk heads of `sse`; `ChoiceChunks`
encodes `ChoiceDelta`s (tools, reasoning, `n`, logprobs) with `ChunkWriter`.
Both end with the usage chunk when asked and `[DONE]`; a failure after the
first byte is an OpenAI-shaped `error` event and no `[DONE]`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from gateway.http.errors import GatewayError
from gateway.serving.openai import sse
from gateway.serving.openai.answers import ChunkWriter
from gateway.serving.orchestrator import Finished
from gateway.serving.turn.accounting import usage_dict
from gateway.serving.turn.prepare import Prepared


class PlainChunks:
    def __init__(self, p: Prepared, model: str, *, chat: bool) -> None:
        self._chat = chat
        self._include_usage = p.include_usage
        self._enc = (sse.ChatChunkEncoder if chat else sse.CompletionChunkEncoder)(p.request_id, p.created, model)

    async def events(self, source: AsyncIterator[Any]) -> AsyncIterator[bytes]:
        enc = self._enc
        if isinstance(enc, sse.ChatChunkEncoder):
            yield enc.role()
        async for ev in source:
            if isinstance(ev, str):
                yield enc.content(ev)
            else:
                assert isinstance(ev, Finished)
                # The end of the stream in one write: finish, usage, [DONE].
                usage = enc.usage(usage_dict([ev])) if self._include_usage else b""
                yield enc.finish(ev.finish_reason) + usage + sse.DONE
                return
        yield sse.DONE

    def failed(self, exc: GatewayError) -> bytes:
        return sse.error_event(exc.body())


class ChoiceChunks:
    def __init__(self, p: Prepared, model: str, *, chat: bool) -> None:
        self._p = p
        self._chat = chat
        self._writer = ChunkWriter(p, model, chat=chat)

    async def events(self, source: AsyncIterator[Any]) -> AsyncIterator[bytes]:
        writer = self._writer
        if self._chat:
            for i in range(len(self._p.jobs)):
                yield writer.role(i)
        done: list[Finished] = []
        async for delta in source:
            if delta.finished is not None:
                done.append(delta.finished)
            chunk = writer.delta(delta)
            if chunk is not None:
                yield chunk
        if self._p.include_usage:
            yield writer.usage(usage_dict(done))
        yield sse.DONE

    def failed(self, exc: GatewayError) -> bytes:
        return sse.error_event(exc.body())
