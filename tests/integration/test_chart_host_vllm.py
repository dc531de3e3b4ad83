"""The chart's containers run as host processes (testing.chart_host): the
commands, args and environment the rendered chart gives the `db upgrade` init
container, two vLLM workers, the gateway and the console, then the containers
test's traffic: a chat request with branch headers, an operator pin that
switches a worker in place, a second request across the new split, a third
with every worker pinned to prefill, a SIGTERM stop. No images: this is the
product's behaviour under the chart's settings, which tests/containers then
checks inside the images.
"""

from __future__ import annotations

import json
import pathlib

import pytest

from testing.chart_host import run_on_host
from testing.chart_scenario import ScenarioConfig
from testing.vllm_cluster import DEMO_MODEL, free_port
from tests.helm.helm_render import default_library

pytestmark = [pytest.mark.vllm, pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    if not default_library().exists():
        pytest.skip("helm-sdkpy's library is missing; `make setup` installs it")
    ports = sorted({free_port() for _ in range(8)})
    cfg = ScenarioConfig(
        model_dir=pathlib.Path(DEMO_MODEL).resolve(),
        product_image="unused:host",
        worker_image="unused:host",
        gateway_port=ports[0],
        console_port=ports[1],
        worker_ports=(ports[2], ports[3]),
        ready_timeout_s=300,
    )
    result = run_on_host(cfg, tmp_path_factory.mktemp("chart-host"))
    print(json.dumps(result, indent=1))
    return result


def test_both_workers_serve_the_gateway_the_chart_wires(report: dict) -> None:
    assert report["started"]
    assert report["node_ids_are_pod_names"]
    assert set(report["nodes_before_switch"].values()) == {"decode/healthy"}, report["nodes_before_switch"]


def test_request_after_an_operator_pin_switch_is_served(report: dict) -> None:
    assert report["switch_ok"], report["switch"]
    assert report["switch"]["same_process"]
    assert sorted(report["nodes_after_switch"].values()) == ["decode/healthy", "prefill/healthy"], report
    assert [r["status"] for r in report["requests"]] == [200, 200], report["requests"]
    assert report["request_ok"]


def test_a_cluster_pinned_all_prefill_still_serves(report: dict) -> None:
    assert set(report["nodes_all_prefill"].values()) == {"prefill/healthy"}, report["nodes_all_prefill"]
    assert report["all_prefill_request"]["ok"], report["all_prefill_request"]


def test_every_process_stops_on_sigterm(report: dict) -> None:
    assert report["clean_stop"], report["stops"]
    assert len(report["stops"]) == 4
