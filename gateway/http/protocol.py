"""The gateway's HTTP protocol: uvicorn's httptools protocol over a
`CoalescingTransport` (`gateway.http.coalesce`), telling the app whether
the client is gone (`CLIENT_GONE`) and how to write a body message without
`send` (`BODY_WRITE`), both read by the SSE response (`gateway.http.sse`).

A module of its own, named by `gateway.http.server.PROTOCOL`, so that every
gateway process imports it by name: one process and each child of
`evolving-infra gateway --workers N` (a spawned process gets its server's
settings pickled, a class by its import path).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.http.coalesce import CoalescingTransport
from gateway.http.sse import BODY_WRITE, CLIENT_GONE


class CycleExtensions:
    """The scope extensions of one uvicorn request cycle: whether its client
    is gone (`CLIENT_GONE`) and how to write a body message without `send`
    (`BODY_WRITE`).

    The cycle is held by a weak reference: the scope they sit in is the
    cycle's own, and closures over the cycle made a reference cycle per
    request (cycle -> scope -> extensions -> closure -> cycle) that only
    the garbage collector could free: ~20 objects a request, a young
    collection every ~1,000 requests at ~9 ms each (2.7 % of the CPU at
    concurrency 32; docs/benchmarks-history.md, seventh pass). A cycle
    that is gone counts as a client gone, with nothing to write to."""

    __slots__ = ("_cycle",)

    def __init__(self, cycle: Any) -> None:
        self._cycle = weakref.ref(cycle)

    def as_dict(self) -> dict[str, Any]:
        # ASGI types extension values as dicts; ours are callables
        return {CLIENT_GONE: self.client_gone, BODY_WRITE: self.writer_for}

    def client_gone(self) -> bool:
        cycle = self._cycle()
        return cycle is None or bool(cycle.disconnected)

    def write(self, body: bytes) -> bool:
        """Write a body message chunk-framed when the cycle is where uvicorn's
        `send` would write it at once (response started and not complete,
        chunked, client there, writing not paused); False when it is not:
        the caller then sends the message the ASGI way."""
        cycle = self._cycle()
        if (
            cycle is None
            or cycle.disconnected
            or cycle.flow.write_paused
            or not cycle.chunked_encoding
            or cycle.response_complete
            or not cycle.response_started
        ):
            return False
        if body:  # an empty chunk would end the body
            cycle.transport.write(b"%x\r\n%b\r\n" % (len(body), body))
        return True

    def writer_for(self, send: Any) -> Callable[[bytes], bool] | None:
        """`BODY_WRITE`: given the `send` a response was called with, `write`
        when that `send` is the cycle's own (None when a middleware wraps it:
        every message must then pass through it)."""
        cycle = self._cycle()
        return self.write if cycle is not None and send == cycle.send else None


class GatewayHttpToolsProtocol(HttpToolsProtocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # as uvicorn's
        super().connection_made(CoalescingTransport(transport, self.loop))

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle.scope is self.scope:  # not an upgrade: a request the app will see
            self.scope["extensions"] = CycleExtensions(cycle).as_dict()
