"""A lean `text/event-stream` response.

Starlette's StreamingResponse runs a task group per response to watch for
disconnects; on the hot path that costs more than the gateway's own work.
Here one `receive()` task watches, and the body stops at the next event
after the client left (the body's `finally` then aborts the worker).
`on_close` runs exactly once, even when the body never started.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

DONE = b"data: [DONE]\n\n"  # OpenAI's last event: the response ends in the same write


class EventStreamResponse(Response):
    media_type = "text/event-stream"

    def __init__(
        self,
        body: AsyncGenerator[bytes, None],
        *,
        headers: dict[str, str],
        on_close: Callable[[], Awaitable[object]],
    ) -> None:
        super().__init__(headers={**headers, "cache-control": "no-cache"}, media_type=self.media_type)
        # Streamed with chunked encoding: no content-length.
        self.raw_headers = [(k, v) for k, v in self.raw_headers if k != b"content-length"]
        self._body = body
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watch = asyncio.ensure_future(receive())
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            ended = False  # the body's last event ends the response in the same write
            async for chunk in self._body:
                if ended:
                    continue  # nothing follows [DONE]; the body runs to its end (its cleanup)
                if watch.done():  # http.disconnect: nobody is reading any more
                    break
                ended = chunk.endswith(DONE)
                await send({"type": "http.response.body", "body": chunk, "more_body": not ended})
            else:
                if not ended:
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            watch.cancel()
            await self._body.aclose()
            await self._on_close()
