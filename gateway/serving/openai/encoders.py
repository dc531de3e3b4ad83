"""The OpenAI leaf's stream encoders.

`PlainChunks` (gateway.serving.turn.pipeline.PlainEncoder) encodes a plain
request's text, event by event, with the pre-rendered chunk heads of `sse`;
`ChoiceChunks` (gateway.serving.turn.pipeline.StreamEncoder) encodes
`ChoiceDelta`s (tools, reasoning, `n`, logprobs) with `ChunkWriter`. Both
end with the usage chunk when asked and `[DONE]`; a failure after the
first byte is an OpenAI-shaped `error` event and no `[DONE]`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from gateway.http.errors import GatewayError
from gateway.serving.jobs import Finished
from gateway.serving.openai import sse
from gateway.serving.openai.answers import ChunkWriter
from gateway.serving.turn.accounting import usage_dict
from gateway.serving.turn.prepare import Prepared


class PlainChunks:
    def __init__(self, p: Prepared, model: str, *, chat: bool) -> None:
        self._include_usage = p.include_usage
        self._enc = (sse.ChatChunkEncoder if chat else sse.CompletionChunkEncoder)(p.request_id, p.created, model)
        # One text delta's event: the chunk encoder's own method, bound once (a call less a relayed token).
        self.text: Callable[[str], bytes] = self._enc.content

    def start(self) -> bytes:
        enc = self._enc
        return enc.role() if isinstance(enc, sse.ChatChunkEncoder) else b""

    def end(self, tail: str, done: Finished) -> bytes:
        # The end of the stream in one write: the held-back text, finish, usage, [DONE].
        enc = self._enc
        usage = enc.usage(usage_dict([done])) if self._include_usage else b""
        return (enc.content(tail) if tail else b"") + enc.finish(done.finish_reason) + usage + sse.DONE

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
