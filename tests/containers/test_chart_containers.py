"""The product's images run as the Helm chart starts them (podman, host network).

Every container comes from the rendered chart (testing.chart_scenario): the
gateway's `db upgrade` init container, two CPU workers serving the demo model
(data/demo-model, SmolLM2-135M-Instruct, on the chart's read-only model
volume), the gateway and the console, with the chart's commands, environment,
user, read-only root filesystem and volumes. Fails when a chart command or an
EVOLVING_* setting is missing from an image, when bench/ or testing/ are in
one, when the C span encoder does not import in one, when a read-only
container needs to write outside its volumes, when a worker starts without
its NIXL agent (UCX), when a request or the operator pin's in-place switch
fails, or when a container must be killed to stop.
Needs root, podman and `make images` (`make test-containers` does both);
skipped with the reason otherwise. Slow: two vLLM engines.
"""

from __future__ import annotations

import json
import os

import pytest

from testing import podman
from testing.chart_scenario import DEMO_MODEL, ScenarioConfig, run_scenario
from testing.vllm_cluster import free_port

pytestmark = [pytest.mark.containers, pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(1800)]

REPO = os.environ.get("IMAGE_REPO", "localhost/evolving-infra")
TAG = os.environ.get("IMAGE_TAG", "0.1.0")
PRODUCT = f"{REPO}/evolving-infra:{TAG}"
WORKER = f"{REPO}/evolving-infra-worker-cpu:{TAG}"


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    reason = podman.available()
    if reason:
        pytest.skip(reason)
    missing = [image for image in (PRODUCT, WORKER) if not podman.image_exists(image)]
    if missing:
        pytest.skip(f"images not built: {missing}; run `make images`")
    if not (DEMO_MODEL / "config.json").exists():
        pytest.skip(f"no model at {DEMO_MODEL}; `make setup` builds the demo model")
    ports = sorted({free_port() for _ in range(8)})
    cfg = ScenarioConfig(
        model_dir=DEMO_MODEL.resolve(),
        product_image=PRODUCT,
        worker_image=WORKER,
        gateway_port=ports[0],
        console_port=ports[1],
        worker_ports=(ports[2], ports[3]),
    )
    result = run_scenario(cfg, tmp_path_factory.mktemp("containers"))
    print(json.dumps(result, indent=1))
    return result


def test_images_hold_every_chart_command_and_setting_and_no_bench_or_testing(report: dict) -> None:
    checked = report["images_checked"]
    assert set(checked) == {PRODUCT, WORKER}
    for image, result in checked.items():
        assert result["missing_commands"] == [], image
        assert result["missing_env"] == [], image
        assert result["missing_packages"] == [], image
        assert result["bench_or_testing"] == [], image
        assert result["missing_native"] == [], image  # the C span encoder (Dockerfile, stage spanwire)
    assert checked[PRODUCT]["env_checked"] > 10  # the gateway's settings, not an empty list


def test_started_with_the_charts_user_and_read_only_root(report: dict) -> None:
    assert report["started"]
    assert set(report["ready_s"]) == {
        "ei-evolving-infra-worker-0-worker",
        "ei-evolving-infra-worker-1-worker",
        "ei-evolving-infra-gateway-0-gateway",
        "ei-evolving-infra-console-0-console",
    }
    assert report["read_only_root"]
    assert set(report["read_only_containers"]) == {
        "ei-evolving-infra-gateway-0-gateway",
        "ei-evolving-infra-console-0-console",
    }
    for name in report["read_only_containers"]:
        writes = report["writes"][name]
        assert writes["root"] == "Read-only file system" and writes["uid"] == "10001", writes
        assert set(writes["volumes"].values()) == {"written"}, writes


def test_workers_serve_the_demo_model_read_only_with_a_nixl_agent(report: dict) -> None:
    assert report["model"] == "demo-model"
    for worker in ("ei-evolving-infra-worker-0-worker", "ei-evolving-infra-worker-1-worker"):
        assert report["model_mounts"][worker] == {"target": "/models", "read_only": True}, report["model_mounts"]
    assert report["nixl_ok"], report["kv_agents"]
    assert set(report["kv_agents"]) == {"ei-evolving-infra-worker-0-worker", "ei-evolving-infra-worker-1-worker"}


def test_chat_request_and_operator_pin_switch_a_worker_in_place(report: dict) -> None:
    assert report["node_ids_are_pod_names"]
    assert report["request_ok"], report["requests"]
    assert report["switch_ok"], report["switch"]
    assert report["switch"]["same_process"]
    assert report["all_prefill_request"]["ok"], report["all_prefill_request"]


def test_every_container_stops_on_sigterm(report: dict) -> None:
    assert report["clean_stop"], report["stops"]
    assert len(report["stops"]) == 4
