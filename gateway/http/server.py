"""Serving a gateway process: uvicorn on uvloop and httptools, the process
tuned for the request path. What `evolving-infra gateway` / `up` and
`bench gateway` run, and each child of `gateway --workers N`
(`server_options` and `prepare_process`, the same in both).

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
  Both hold the request's cycle weakly (`gateway.http.protocol`): a
  request leaves no reference cycle for the garbage collector.
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
  310-445 ms before, 38-44 ms after; docs/benchmarks.md). At exit the
  heap goes back to the collector (no extension module reports a leak).
- A request uvicorn's shutdown cancels (the graceful window over) is one
  warning line (`ShutdownCutLog`), not a traceback per request.
"""

from __future__ import annotations

import asyncio
import atexit
import gc
import logging
import os
from collections.abc import Callable
from types import FrameType
from typing import Any

# (gen0 allocations, gen1 and gen2 collections) between collections; CPython's default is (700, 10, 10).
GC_THRESHOLDS = (20_000, 20, 50)


def tune_gc() -> int:
    """Freeze what is alive now and raise the thresholds; returns the frozen
    object count. At exit the frozen heap goes back to the collector, so the
    interpreter's last collection frees it: extension modules then see their
    objects released (Triton's bindings, imported through vLLM, otherwise
    print nanobind's leak report of ~600 lines when the gateway stops)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    atexit.unregister(gc.unfreeze)  # once, however often it is tuned
    atexit.register(gc.unfreeze)
    return gc.get_freeze_count()


# The HTTP protocol every gateway process serves with, by name (`server_options`).
PROTOCOL = "gateway.http.protocol:GatewayHttpToolsProtocol"


def gateway_protocol() -> type:
    """`PROTOCOL`'s class (tests and in-process servers pass it to uvicorn themselves)."""
    from gateway.http.protocol import GatewayHttpToolsProtocol

    return GatewayHttpToolsProtocol


def server_options() -> dict[str, Any]:
    """The uvicorn settings of every gateway process, one or each of
    `--workers N`: uvloop, the gateway's protocol, no access log, no
    `server` header, no proxy-header rewriting."""
    return {"loop": "uvloop", "http": PROTOCOL, "access_log": False, "proxy_headers": False, "server_header": False}


class ShutdownCutLog(logging.Filter):
    """uvicorn's error log, for a request its shutdown cancelled (still running
    when the graceful window closed): one warning line, not "Exception in
    ASGI application" and the CancelledError's traceback. The request's own
    log says which it was (a stream: "cut by the gateway's shutdown", and its
    client got a typed error event)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], asyncio.CancelledError):
            record.msg = "a request still running when the shutdown's grace ended was cut"
            record.args, record.exc_info, record.exc_text = (), None, None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def prepare_process() -> None:
    """What a gateway process does once its app is built, before it serves:
    the tokenizer's thread pool off unless the environment says otherwise,
    the collector tuned (`tune_gc`), shutdown cuts logged in one line."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    tune_gc()
    errors_log = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, ShutdownCutLog) for f in errors_log.filters):
        errors_log.addFilter(ShutdownCutLog())


def build_server(
    app: Any,
    *,
    host: str,
    port: int,
    log_level: str = "info",
    on_exit: Callable[[], None] | None = None,
    **uvicorn_options: Any,
) -> Any:
    """The uvicorn server for `app` (not started), with `server_options()`
    unless `uvicorn_options` say otherwise; `on_exit` runs first thing when
    SIGINT/SIGTERM arrives, before uvicorn stops taking requests."""
    import uvicorn

    class _Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if on_exit is not None:
                on_exit()
            super().handle_exit(sig, frame)

    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, **{**server_options(), **uvicorn_options})
    return _Server(config)


def serve_app(app: Any, *, host: str, port: int, log_level: str = "info", **options: Any) -> None:
    """Run `app` until SIGINT/SIGTERM (blocking); `options` as `build_server`'s.
    Exits with status 3 when the server never started (its lifespan start-up
    failed), as `uvicorn.run` does."""
    server = build_server(app, host=host, port=port, log_level=log_level, **options)
    prepare_process()  # after the server's logging is set up (its filter stays)
    server.run()
    if not server.started:
        raise SystemExit(3)
