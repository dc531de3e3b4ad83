"""A lean `text/event-stream` response.

Starlette's StreamingResponse runs a task group per response to watch for
disconnects; on the hot path that costs more than the gateway's own work.
Here the body stops at the next event after the client left (the body's
`finally` then aborts the worker). The gateway's server says whether the
client is gone through a scope extension (`CLIENT_GONE`, a callable: no
task at all); under any other ASGI server one `receive()` task watches.
The events between the first and the last go out through the server's
`BODY_WRITE` when it has one (a long stream's every token), else as ASGI
messages.
A body given a `DirectBody` may write events itself between its first
message and its last, while it waits (a relay lane: a long stream's tokens
written from the worker read's callback, no task woken); the response
opens it once the first message is out and only when the server has
`BODY_WRITE`, and its `ready()` is the writer's own check, so such a write
never overtakes a message the response still holds.
`on_close` runs exactly once, even when the body never started. A traced
request's `relay` hears of its first body message and its last. After
the last event the response yields to the loop once, so the body's own
cleanup runs after the server has sent the answer's end.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Protocol

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

DONE = b"data: [DONE]\n\n"  # OpenAI's last event: the response ends in the same write
# scope["extensions"][CLIENT_GONE](): True once the client closed the connection (gateway.http.server).
CLIENT_GONE = "gateway.client_gone"
# scope["extensions"][BODY_WRITE](send): for the server's own `send`, a callable that writes
# a body message that is not the last (True), or returns False when it cannot now (the
# caller sends the message); None for any other `send` (a middleware's).
BODY_WRITE = "gateway.write_body"
_HEAD = [(b"cache-control", b"no-cache"), (b"content-type", b"text/event-stream; charset=utf-8")]


class Relay(Protocol):
    """A traced request's turn (gateway.telemetry), told before the first body
    message and the last are sent."""

    def sending(self, total: int, last: bool) -> None:
        """`total`: the body's bytes up to this message's end; `last`: its last message."""


def _told(relay: Relay, gone: Callable[[], bool], relayed: int, last: bool) -> bool:
    """Tells `relay` of the body's first message (not empty) or its last, with
    the bytes relayed; False when the client is gone (nothing to tell)."""
    if gone():
        return False
    relay.sending(relayed, last)
    return True


class DirectBody:
    """The body's own way to the connection (see the module doc): shut until
    the response opens it, and again once the response stops reading the body."""

    __slots__ = ("_write", "sent")

    def __init__(self) -> None:
        self._write: Callable[[bytes], bool] | None = None
        self.sent = 0  # bytes written this way

    def ready(self) -> bool:
        """A `write` now goes out at once (the writer's check; nothing is written)."""
        write = self._write
        return write is not None and write(b"")

    def write(self, chunk: bytes) -> None:
        """Write `chunk`, a message that is not the body's last; only right after `ready()`.
        Raises if the writer refuses it (the bytes would be lost, not delayed)."""
        if self._write is None or not self._write(chunk):
            raise RuntimeError("a direct body write was refused: write only right after ready()")
        self.sent += len(chunk)

    def open(self, write: Callable[[bytes], bool]) -> None:
        self._write = write

    def shut(self) -> None:
        self._write = None


class EventStreamResponse(Response):
    media_type = "text/event-stream"

    def __init__(
        self,
        body: AsyncGenerator[bytes, None],
        *,
        headers: dict[str, str],
        on_close: Callable[[], Awaitable[object]],
        direct: DirectBody | None = None,
    ) -> None:
        # Streamed with chunked encoding: no content-length. The head is built here, not by
        # Starlette's `init_headers` (the same bytes for less work).
        self.status_code = 200
        self.background = None
        self.raw_headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()] + _HEAD
        self._body = body
        self._on_close = on_close
        self._direct = direct
        self.relay: Relay | None = None  # set by the app when the request is traced

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        extensions = scope.get("extensions", {})
        gone: Callable[[], bool] | None = extensions.get(CLIENT_GONE)
        writer_for = extensions.get(BODY_WRITE)
        write: Callable[[bytes], bool] | None = writer_for(send) if writer_for is not None else None
        relay, relayed = self.relay, 0
        direct = self._direct or DirectBody()  # opened only with the server's writer
        watch = None
        if gone is None:  # another server: wait for its http.disconnect
            watch = asyncio.ensure_future(receive())
            gone = watch.done
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            ended = False  # the body's last event ends the response in the same write
            async for chunk in self._body:
                if ended:
                    continue  # nothing follows [DONE]; the body runs to its end (its cleanup)
                ended = chunk.endswith(DONE)
                if relay is not None:
                    relayed += len(chunk)
                    if (ended or relayed == len(chunk)) and not _told(relay, gone, relayed + direct.sent, ended):
                        break
                if not ended and write is not None and write(chunk):
                    direct.open(write)  # after the first message: the body may write between yields
                    continue  # written (the writer writes only while the client is there)
                if gone():  # nobody is reading any more
                    break
                await send({"type": "http.response.body", "body": chunk, "more_body": not ended})
                if ended:
                    # Let the loop's turn end before the body's cleanup (accounting, releasing the
                    # slot): a server that writes at the turn's end (gateway.http.coalesce) then
                    # sends the answer's last bytes first.
                    await asyncio.sleep(0)
            else:
                if not ended:
                    if relay is not None:
                        relay.sending(relayed + direct.sent, True)
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            direct.shut()
            if watch is not None:
                watch.cancel()
            await self._body.aclose()
            await self._on_close()
