"""testing.chart_pods: the rendered chart read into `podman run` arguments (pure;
the render uses the real Helm engine, no container runs)."""

from __future__ import annotations

import pathlib

import pytest

from testing.chart_host import rewrite
from testing.chart_pods import (
    ChartPodError,
    VolumeBinding,
    expand_refs,
    find_object,
    pod_containers,
    quantity_bytes,
    secrets_of,
)
from testing.chart_scenario import ChartCluster, ScenarioConfig, chart_values, render
from tests.helm.helm_render import default_library


@pytest.mark.parametrize(
    ("text", "env", "expected"),
    [
        ("--node-id=$(POD_NAME)", {"POD_NAME": "w-0"}, "--node-id=w-0"),
        ("$(MISSING)", {}, "$(MISSING)"),  # undefined: kept as written
        ("$$(POD_NAME)", {"POD_NAME": "w-0"}, "$(POD_NAME)"),  # escaped
        ("a$(X)b$(X)", {"X": "1"}, "a1b1"),
    ],
)
def test_expand_refs_follows_kubernetes(text: str, env: dict[str, str], expected: str) -> None:
    assert expand_refs(text, env) == expected


CFG = ScenarioConfig(
    model_dir=pathlib.Path("/data/demo-model"),
    product_image="localhost/evolving-infra/evolving-infra:0.1.0",
    worker_image="localhost/evolving-infra/evolving-infra-worker-cpu:0.1.0",
    gateway_port=18000,
    console_port=18501,
    worker_ports=(18100, 18101),
)


@pytest.mark.parametrize(("q", "n"), [("1Gi", 1024**3), ("512Mi", 512 * 1024**2), ("1000", 1000)])
def test_quantity_bytes(q: str, n: int) -> None:
    assert quantity_bytes(q) == n


@pytest.fixture(scope="module")
def objects(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    if not default_library().exists():
        pytest.skip("helm-sdkpy's library is missing; `make setup` installs it")
    values = chart_values(CFG, 1, "postgresql+psycopg://u@127.0.0.1:5432/x", "pfx", "admin-token-0123456789")
    return render(values, tmp_path_factory.mktemp("render"))


@pytest.mark.helm
def test_gateway_pod_reads_command_env_user_and_read_only_root_from_the_chart(objects: list[dict]) -> None:
    secrets = secrets_of(objects)
    runs = pod_containers(find_object(objects, "Deployment", "ei-evolving-infra-gateway"), "gw-0", secrets)
    init, gateway = runs
    assert init.init and init.command == ["evolving-infra", "db", "upgrade"]
    assert init.env["EVOLVING_DB_URL"] == "postgresql+psycopg://u@127.0.0.1:5432/x"
    assert gateway.command == ["evolving-infra", "gateway"]
    assert "--port=18000" in gateway.args
    assert gateway.env["EVOLVING_ADMIN_TOKEN"] == "admin-token-0123456789"
    assert gateway.env["EVOLVING_REDIS_PREFIX"] == "pfx"
    assert gateway.user == "10001:10001" and gateway.read_only_root and gateway.no_new_privileges
    assert gateway.cap_drop == ["ALL"]
    assert gateway.readiness is not None and (gateway.readiness.path, gateway.readiness.port) == ("/readyz", 18000)
    volumes = {"model": VolumeBinding(host_path="/data"), "tmp": VolumeBinding(host_path="/host/tmp")}
    args = gateway.podman_args(volumes, {"svc": "127.0.0.1"})
    assert args[args.index("--entrypoint") + 1] == '["evolving-infra", "gateway"]'
    assert "--read-only-tmpfs=false" in args and "--user" in args
    assert "/data:/models:ro" in args and "/host/tmp:/tmp:rw" in args
    assert args[-len(gateway.args) - 1] == "localhost/evolving-infra/evolving-infra:0.1.0"


@pytest.mark.helm
def test_worker_pod_expands_its_pod_name_and_keeps_the_image_user(objects: list[dict]) -> None:
    sts = find_object(objects, "StatefulSet", "ei-evolving-infra-worker")
    (worker,) = pod_containers(sts, "ei-evolving-infra-worker-1", secrets_of(objects))
    assert "--node-id=ei-evolving-infra-worker-1" in worker.args
    assert "--port=18101" in worker.args
    assert worker.user is None and not worker.read_only_root
    shm = next(m for m in worker.mounts if m.target == "/dev/shm")
    assert shm.memory_backed and shm.size_limit_bytes == 2 * 1024**3
    with pytest.raises(ChartPodError, match="no host binding"):
        worker.podman_args({}, {})


@pytest.mark.helm
def test_plan_gives_every_pod_the_one_release_secret(tmp_path: pathlib.Path) -> None:
    # The plan renders the chart once per worker (each its own port); the chart
    # draws a random cluster token per render, and a worker with another token
    # answers the gateway's heartbeats 401 (the containers test's old 503).
    if not default_library().exists():
        pytest.skip("helm-sdkpy's library is missing; `make setup` installs it")
    pods, workers, _ = ChartCluster(CFG, tmp_path).plan()
    tokens = {r.container_name: r.env.get("EVOLVING_CLUSTER_TOKEN") for r in pods + workers}
    gateway_token = tokens["ei-evolving-infra-gateway-0-gateway"]
    assert gateway_token
    assert {tokens[w.container_name] for w in workers} == {gateway_token}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("--model=/models/demo-model", "--model=/h/m/demo-model"),
        ("/tmp", "/h/tmp"),
        ("/tmp/hf", "/h/tmp/hf"),
        ("--run-dir=/run/evolving-infra", "--run-dir=/h/run"),
        ("/models2/x", "/models2/x"),  # another folder, not under the mount
        ("http://svc:8000/tmp", "http://127.0.0.1:8000/tmp"),  # a URL path is no file path
        ("http://svc.ns.svc:1,http://svc:2", "http://127.0.0.1:1,http://127.0.0.1:2"),
        ("http://svc-other:1", "http://svc-other:1"),
    ],
)
def test_host_rewrite_moves_mount_paths_and_release_hosts(text: str, expected: str) -> None:
    paths = {"/models": "/h/m", "/tmp": "/h/tmp", "/run/evolving-infra": "/h/run"}
    assert rewrite(text, paths, ["svc", "svc.ns.svc"]) == expected
