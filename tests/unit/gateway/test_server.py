"""The gateway process's serving set-up: uvloop and httptools named, the
tokenizer's own thread pool off, the start-up heap frozen out of the GC."""

from __future__ import annotations

import gc
import os
import signal

import pytest

from gateway.http import server


@pytest.fixture
def restore_gc():
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def test_tune_gc_freezes_the_start_up_heap(restore_gc) -> None:
    frozen = server.tune_gc()
    assert frozen > 1000 and gc.get_freeze_count() == frozen
    assert gc.get_threshold() == server.GC_THRESHOLDS


def test_the_server_names_uvloop_and_httptools_and_runs_on_exit_first() -> None:
    calls: list[str] = []
    app = object()
    srv = server.build_server(app, host="127.0.0.1", port=1234, log_level="warning", on_exit=lambda: calls.append("x"))
    assert srv.config.app is app and (srv.config.loop, srv.config.http) == ("uvloop", "httptools")
    assert srv.config.access_log is False
    srv.handle_exit(signal.SIGTERM, None)
    assert calls == ["x"] and srv.should_exit
    plain = server.build_server(app, host="127.0.0.1", port=1234, timeout_graceful_shutdown=5)
    plain.handle_exit(signal.SIGTERM, None)
    assert plain.should_exit and plain.config.timeout_graceful_shutdown == 5


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
