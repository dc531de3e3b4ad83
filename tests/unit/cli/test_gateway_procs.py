"""`evolving-infra gateway --workers N`: what the parent checks and hands its children."""

from __future__ import annotations

import pytest

from cli import gateway_procs
from gateway.settings import GatewaySettings


def test_children_get_the_parents_settings_through_the_environment() -> None:
    s = GatewaySettings(
        host="0.0.0.0",
        port=18080,
        block_size=64,
        worker_urls=("http://w0:8100", "http://w1:8100"),
        data_dir="/tmp/d",
        model_dir="/m",
        model_name="demo",
        planner_mode="auto",
    )
    env = gateway_procs.child_environment(s)
    assert env == {
        "EVOLVING_HOST": "0.0.0.0",
        "EVOLVING_PORT": "18080",
        "EVOLVING_BLOCK_SIZE": "64",
        "EVOLVING_WORKER_URLS": "http://w0:8100,http://w1:8100",
        "EVOLVING_DATA_DIR": "/tmp/d",
        "EVOLVING_PLANNER_MODE": "auto",
        "EVOLVING_MODEL_DIR": "/m",
        "EVOLVING_MODEL_NAME": "demo",
    }
    assert GatewaySettings.from_env(env).port == 18080  # what a child reads back


def test_several_processes_need_redis_and_no_fixed_replica_id() -> None:
    gateway_procs.check(GatewaySettings(), 1)
    with pytest.raises(SystemExit, match="EVOLVING_DIRECTORY_URL"):
        gateway_procs.check(GatewaySettings(), 2)
    shared = GatewaySettings(directory_url="redis://127.0.0.1:6379/0")
    gateway_procs.check(shared, 4)
    with pytest.raises(SystemExit, match="EVOLVING_REPLICA_ID"):
        gateway_procs.check(GatewaySettings(directory_url="redis://r/0", replica_id="g0"), 2)
    with pytest.raises(SystemExit, match=">= 1"):
        gateway_procs.check(shared, 0)


def test_open_streams_get_the_drain_setting_on_shutdown(monkeypatch: pytest.MonkeyPatch) -> None:
    """`gateway`/`up` hand EVOLVING_DRAIN_S to the server as its graceful-shutdown
    time, in one process and with several (the chart derives it from the pod's
    grace period; a fixed few seconds cut agent turns at every rolling update)."""
    import argparse

    import uvicorn

    import gateway.compose
    import gateway.http.server
    from cli import up

    settings = GatewaySettings.from_env({"EVOLVING_DRAIN_S": "41.5"})
    assert settings.drain_s == 41.5 and GatewaySettings().drain_s == 30.0
    with pytest.raises(ValueError, match="drain_s"):
        GatewaySettings(drain_s=-1)
    seen: dict[str, dict[str, object]] = {}
    monkeypatch.setattr(gateway_procs.os, "environ", {})  # the children's environment, kept out of this process
    monkeypatch.setattr(gateway.compose, "compose_app", lambda s, control_plane=None: "app")
    monkeypatch.setattr(gateway.http.server, "serve_app", lambda app, **kw: seen.update(one=kw))
    up.serve(settings, "warning")
    monkeypatch.setattr(uvicorn, "run", lambda *a, **kw: seen.update(several=kw))
    gateway_procs.run(argparse.Namespace(workers=2, log_level="warning"), settings)
    assert seen["one"]["timeout_graceful_shutdown"] == 42  # whole seconds, rounded up
    assert seen["several"]["timeout_graceful_shutdown"] == 42


def test_each_child_serves_as_one_gateway_process_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """The children get the one process's server settings (uvloop, the
    gateway's protocol by name, no access log or `server` header) and build
    their app through `child_app`, which prepares the process as
    `serve_app` does (the collector tuned, the tokenizer's pool off)."""
    import argparse

    import uvicorn

    import gateway.compose
    import gateway.http.server

    runs: list[tuple[tuple[object, ...], dict[str, object]]] = []
    monkeypatch.setattr(gateway_procs.os, "environ", {})
    monkeypatch.setattr(uvicorn, "run", lambda *a, **kw: runs.append((a, kw)))
    gateway_procs.run(argparse.Namespace(workers=3, log_level="warning"), GatewaySettings())
    ((args, kw),) = runs
    assert args == ("cli.gateway_procs:child_app",) and kw["factory"] is True and kw["workers"] == 3
    assert {k: kw[k] for k in gateway.http.server.server_options()} == gateway.http.server.server_options()
    app = object()
    prepared: list[bool] = []
    monkeypatch.setattr(gateway.compose, "app_from_env", lambda: app)
    monkeypatch.setattr(gateway.http.server, "prepare_process", lambda: prepared.append(True))
    assert gateway_procs.child_app() is app and prepared == [True]
