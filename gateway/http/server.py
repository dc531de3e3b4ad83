"""Serving one gateway process: uvicorn on uvloop and httptools, the process
tuned for the request path. What `evolving-infra gateway` / `up` and
`bench gateway` run.

- uvloop and httptools are named, not left to uvicorn's "auto" (which falls
  back to asyncio and h11 without a word when they are missing: 1.3-1.6x
  the CPU per request here).
- No access log, no `server` header, no proxy-header rewriting (nothing
  reads the client's address).
- The SSE response learns that its client left from a flag the protocol
  sets (`gateway.http.sse.CLIENT_GONE`), not from a task per response
  waiting on `receive()`, and writes the events between its first and its
  last straight to the connection (`gateway.http.sse.BODY_WRITE`): one
  call a token, not an ASGI message, a coroutine and uvicorn's checks.
  Both hold the request's cycle weakly (`CycleExtensions`): a request
  leaves no reference cycle for the garbage collector.
- Writes gathered per event-loop turn (`gateway.http.coalesce`): one
  `writev` for a response's head and the body messages ready with it, not
  one `send` per message.
- `TOKENIZERS_PARALLELISM=false` unless the environment says otherwise:
  the gateway tokenizes one prompt per call, and the tokenizer's thread
  pool competing with the event loop for the cores made a big prompt stall
  the loop for 0.2-1.6 s here.
- The garbage collector (`tune_gc`): everything alive once the app is
  built (imports, the tokenizer; ~400k objects, most from transformers'
  import of torch) is moved out of the collector's sight (`gc.freeze()`)
  and the young generation collected less often. Full collections over
  that heap paused the loop 136-464 ms under load (p99 at concurrency 32:
  310-445 ms before, 38-44 ms after; docs/benchmarks.md).
"""

from __future__ import annotations

import gc
import os
import weakref
from collections.abc import Callable
from types import FrameType
from typing import Any

from gateway.http.sse import BODY_WRITE, CLIENT_GONE

# (gen0 allocations, gen1 and gen2 collections) between collections; CPython's default is (700, 10, 10).
GC_THRESHOLDS = (20_000, 20, 50)


def tune_gc() -> int:
    """Freeze what is alive now and raise the thresholds; returns the frozen object count."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    return gc.get_freeze_count()


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


def gateway_protocol() -> type:
    """uvicorn's httptools protocol over a `CoalescingTransport`, telling the
    app whether the client is gone (`CLIENT_GONE`) and how to write a body
    message without `send` (`BODY_WRITE`), both read by the SSE response."""
    import asyncio

    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    from gateway.http.coalesce import CoalescingTransport

    class GatewayHttpToolsProtocol(HttpToolsProtocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # as uvicorn's
            super().connection_made(CoalescingTransport(transport, self.loop))

        def on_headers_complete(self) -> None:
            super().on_headers_complete()
            cycle = self.cycle
            if cycle is not None and cycle.scope is self.scope:  # not an upgrade: a request the app will see
                self.scope["extensions"] = CycleExtensions(cycle).as_dict()

    return GatewayHttpToolsProtocol


def build_server(
    app: Any,
    *,
    host: str,
    port: int,
    log_level: str = "info",
    on_exit: Callable[[], None] | None = None,
    **uvicorn_options: Any,
) -> Any:
    """The uvicorn server for `app` (not started): uvloop, httptools, no access
    log; `on_exit` runs first thing when SIGINT/SIGTERM arrives, before
    uvicorn stops taking requests."""
    import uvicorn

    class _Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if on_exit is not None:
                on_exit()
            super().handle_exit(sig, frame)

    uvicorn_options.setdefault("proxy_headers", False)  # nothing here reads the client's address
    uvicorn_options.setdefault("server_header", False)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        loop="uvloop",
        http=gateway_protocol(),
        access_log=False,
        **uvicorn_options,
    )
    return _Server(config)


def serve_app(app: Any, *, host: str, port: int, log_level: str = "info", **options: Any) -> None:
    """Run `app` until SIGINT/SIGTERM (blocking); `options` as `build_server`'s.
    Exits with status 3 when the server never started (its lifespan start-up
    failed), as `uvicorn.run` does."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    tune_gc()
    server = build_server(app, host=host, port=port, log_level=log_level, **options)
    server.run()
    if not server.started:
        raise SystemExit(3)
