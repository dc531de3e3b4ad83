"""The gateway process's serving set-up: uvloop and httptools named, the
tokenizer's own thread pool off, the start-up heap frozen out of the GC, a
request's cycle freed without it."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import weakref
from typing import Any

import pytest
from uvicorn.importer import import_from_string
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from gateway.http import protocol, server


@pytest.fixture
def restore_gc():
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def test_tune_gc_freezes_the_start_up_heap(restore_gc) -> None:
    frozen = server.tune_gc()
    # Frozen objects can still die (another thread of this test process frees some, as in the
    # full suite): from the count tune_gc returned, the frozen generation only shrinks.
    assert frozen > 1000 and 0.99 * frozen <= gc.get_freeze_count() <= frozen
    assert gc.get_threshold() == server.GC_THRESHOLDS


def test_the_server_names_uvloop_and_httptools_and_runs_on_exit_first() -> None:
    calls: list[str] = []
    app = object()
    srv = server.build_server(app, host="127.0.0.1", port=1234, log_level="warning", on_exit=lambda: calls.append("x"))
    assert srv.config.app is app and srv.config.loop == "uvloop"
    assert srv.config.http == server.PROTOCOL  # by name: `--workers N` children import it too
    assert issubclass(server.gateway_protocol(), HttpToolsProtocol)  # httptools, its writes gathered
    assert import_from_string(server.PROTOCOL) is server.gateway_protocol()
    assert srv.config.access_log is False and srv.config.proxy_headers is False and srv.config.server_header is False
    srv.handle_exit(signal.SIGTERM, None)
    assert calls == ["x"] and srv.should_exit
    plain = server.build_server(app, host="127.0.0.1", port=1234, timeout_graceful_shutdown=5)
    plain.handle_exit(signal.SIGTERM, None)
    assert plain.should_exit and plain.config.timeout_graceful_shutdown == 5


def test_the_frozen_heap_goes_back_to_the_collector_at_exit() -> None:
    """An interpreter that ends with its heap frozen never frees it: extension
    modules then report leaks (nanobind's ~600 lines for Triton's bindings,
    imported through vLLM, each time the gateway stopped)."""
    probe = (
        "import atexit, gc\n"
        "atexit.register(lambda: print('frozen at exit', gc.get_freeze_count()))\n"  # runs after tune_gc's
        "from gateway.http.server import tune_gc\n"
        "print('frozen', tune_gc() > 1000)\n"
        "tune_gc()\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split("\n")[:2] == ["frozen True", "frozen at exit 0"]


def test_a_request_the_shutdown_cut_is_one_warning_line(caplog: pytest.LogCaptureFixture) -> None:
    """uvicorn logs a request its shutdown cancelled as an ASGI exception with
    the CancelledError's traceback; the gateway's process logs one warning.
    Every other exception keeps its error and its traceback."""
    import asyncio
    import logging

    log = logging.getLogger("uvicorn.error.test-cut")
    log.addFilter(server.ShutdownCutLog())
    with caplog.at_level(logging.INFO, logger=log.name):
        for exc in (asyncio.CancelledError("Task cancelled, timeout graceful shutdown exceeded"), ValueError("x")):
            try:
                raise exc
            except BaseException as e:  # as uvicorn's run_asgi catches it
                log.error("Exception in ASGI application\n", exc_info=e)
    cut, other = caplog.records
    assert (cut.levelname, cut.getMessage(), cut.exc_info) == (
        "WARNING",
        "a request still running when the shutdown's grace ended was cut",
        None,
    )
    assert other.levelname == "ERROR" and other.exc_info is not None and "ASGI" in other.getMessage()


async def _failing_start_up(scope, receive, send) -> None:
    assert scope["type"] == "lifespan"
    await receive()
    await send({"type": "lifespan.startup.failed", "message": "no"})


def test_serve_app_exits_3_when_the_app_never_starts(restore_gc, monkeypatch) -> None:
    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    with pytest.raises(SystemExit) as exc:
        server.serve_app(_failing_start_up, host="127.0.0.1", port=0, log_level="critical", lifespan="on")
    assert exc.value.code == 3
    assert os.environ["TOKENIZERS_PARALLELISM"] == "false"
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")  # an operator's choice stays
    with pytest.raises(SystemExit):
        server.serve_app(_failing_start_up, host="127.0.0.1", port=0, log_level="critical", lifespan="on")
    assert os.environ["TOKENIZERS_PARALLELISM"] == "true"


def _live_cycles() -> int:
    return sum(type(o) is RequestResponseCycle for o in gc.get_objects())  # no isinstance: no proxy object asked


async def test_the_real_server_streams_whole_answers_and_flags_a_client_that_left() -> None:
    """The gateway's protocol on a socket: a streamed answer arrives whole and
    in order (its writes gathered, the body writer's among them), and the
    app sees the client leave."""
    import asyncio
    import contextlib
    import socket

    from gateway.http.sse import BODY_WRITE, CLIENT_GONE

    seen: dict[str, bool] = {}
    left = asyncio.Event()

    async def app(scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        gone = scope["extensions"][CLIENT_GONE]
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        if scope["path"] == "/wait":
            seen["before"] = gone()
            for _ in range(200):
                await asyncio.sleep(0.01)
                if gone():
                    seen["after"] = True
                    left.set()
                    return
            return
        if scope["path"] == "/direct":  # the body writer, for the server's own send only
            assert scope["extensions"][BODY_WRITE](lambda message: send(message)) is None
            write = scope["extensions"][BODY_WRITE](send)
            assert write(b"a") and write(b"") and write(b"bc")  # an empty message writes nothing
            await send({"type": "http.response.body", "body": b"d", "more_body": False})
            seen["after end"] = write(b"e")  # the response is complete: not written
            return
        for part in (b"a", b"b", b"c"):
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = server.build_server(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    task = asyncio.ensure_future(srv.serve())
    gc.collect()  # what earlier tests left for the collector
    gc.disable()
    cycles_before = _live_cycles()
    try:
        while not srv.started:
            await asyncio.sleep(0.01)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\n")
        data = b""
        while not data.endswith(b"0\r\n\r\n"):
            data += await asyncio.wait_for(reader.read(65536), 5)
        assert data.startswith(b"HTTP/1.1 200 OK\r\n") and b"server:" not in data.lower()
        assert data.endswith(b"\r\n\r\n1\r\na\r\n1\r\nb\r\n1\r\nc\r\n0\r\n\r\n")
        writer.write(b"GET /direct HTTP/1.1\r\nhost: x\r\n\r\n")
        data = b""
        while not data.endswith(b"0\r\n\r\n"):
            data += await asyncio.wait_for(reader.read(65536), 5)
        assert data.endswith(b"\r\n\r\n1\r\na\r\n2\r\nbc\r\n1\r\nd\r\n0\r\n\r\n")
        assert seen.pop("after end") is False
        # Freed by reference counts alone (the collector is off): only the connection's last cycle is alive.
        assert _live_cycles() - cycles_before == 1
        writer.write(b"GET /wait HTTP/1.1\r\nhost: x\r\n\r\n")
        await writer.drain()
        await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        writer.close()
        await asyncio.wait_for(left.wait(), 5)
        assert seen == {"before": False, "after": True}
    finally:
        gc.enable()
        srv.should_exit = True
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(task, 5)


def test_a_cycles_extensions_hold_it_weakly() -> None:
    """The extensions sit in the cycle's own scope: a strong reference back
    would make a reference cycle per request, freed only by the collector.
    Once the cycle is gone, its client counts as gone and nothing is written."""

    class StandInCycle:  # the attributes of uvicorn's RequestResponseCycle the extensions read
        disconnected = False

        def __init__(self) -> None:
            self.scope: dict[str, Any] = {}

        def send(self, message: object) -> None:
            raise AssertionError("not called")

    cycle = StandInCycle()
    ext = protocol.CycleExtensions(cycle)
    cycle.scope["extensions"] = ext.as_dict()  # as uvicorn's protocol sets it
    assert ext.client_gone() is False and ext.writer_for(cycle.send) is not None
    assert ext.writer_for(lambda message: None) is None  # a middleware's send
    ref = weakref.ref(cycle)
    gc.disable()
    try:
        del cycle
        assert ref() is None  # freed by its reference count
    finally:
        gc.enable()
    assert ext.client_gone() is True and ext.writer_for(object()) is None and ext.write(b"x") is False
