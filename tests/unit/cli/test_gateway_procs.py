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
