"""The gateway process's serving set-up: uvloop and httptools named, the
tokenizer's own thread pool off, the start-up heap frozen out of the GC."""

from __future__ import annotations

import gc
import os

import pytest

from gateway import server


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


def test_serve_app_names_uvloop_and_httptools(restore_gc, monkeypatch) -> None:
    import uvicorn

    calls: list[dict] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: calls.append({"app": app, **kw}))
    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    app = object()
    server.serve_app(app, host="127.0.0.1", port=1234, log_level="warning", timeout_graceful_shutdown=5)
    (call,) = calls
    assert call["app"] is app and (call["loop"], call["http"]) == ("uvloop", "httptools")
    assert call["access_log"] is False and call["timeout_graceful_shutdown"] == 5
    assert os.environ["TOKENIZERS_PARALLELISM"] == "false"
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")  # an operator's choice stays
    server.serve_app(app, host="127.0.0.1", port=1234)
    assert os.environ["TOKENIZERS_PARALLELISM"] == "true"
