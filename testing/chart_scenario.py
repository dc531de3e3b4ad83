"""The product's images started as the Helm chart starts them, on this host.

`run_scenario` renders the chart (tests/helm/helm_render.py, the real Helm
engine), takes every container from the rendered objects (testing.chart_pods)
and runs them with podman on the host network: the gateway's `db upgrade`
init container to completion, two CPU workers, the gateway and the console.
Then a chat request with branch headers, an operator pin through the admin API
that must switch a worker in place, and a SIGTERM stop of everything.

PostgreSQL and Redis are this machine's (127.0.0.1:5432 / :6379), given to the
chart as `externalDatabase.url` / `externalRedis.url`: the chart then wires
them through its Secret exactly as for the bundled ones (a fresh database and
a fresh Redis key prefix per run).

What the host network changes, and nothing else: cluster DNS names of the
release's Services and worker pods resolve to 127.0.0.1 (`--add-host`), and
since two workers cannot both listen on the chart's one worker port here,
worker i is rendered with `workers.port` = its own port and the gateway's
EVOLVING_WORKER_URLS (rendered from the first render) gets worker i's port.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import yaml

from testing import podman
from testing.chart_pods import ContainerRun, VolumeBinding, find_object, pod_containers, secrets_of, service_hosts
from testing.image_checks import check_image, check_writes

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHART = ROOT / "helm" / "evolving-infra"
RENDER = ROOT / "tests" / "helm" / "helm_render.py"
RELEASE, NAMESPACE = "ei", "serving"
# The model the containers serve: SmolLM2-135M-Instruct, what `make setup` builds.
DEMO_MODEL = ROOT / "data" / "demo-model"


@dataclass(frozen=True)
class ScenarioConfig:
    model_dir: pathlib.Path  # a HF model folder on the host, mounted read-only
    product_image: str  # repository:tag of Dockerfile's product target
    worker_image: str  # repository:tag of Dockerfile's worker-cpu target
    gateway_port: int
    console_port: int
    worker_ports: tuple[int, int]
    postgres_admin_url: str = "postgresql://postgres@127.0.0.1:5432/postgres"
    redis_url: str = "redis://127.0.0.1:6379/0"
    ready_timeout_s: float = 600


def render(values: dict[str, Any], workdir: pathlib.Path) -> list[dict[str, Any]]:
    path = workdir / f"values-{uuid.uuid4().hex[:6]}.json"
    path.write_text(json.dumps(values))
    cmd = [sys.executable, str(RENDER), str(CHART), str(path), "--release", RELEASE, "--namespace", NAMESPACE]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"helm_render failed: {proc.stderr[-2000:]}")
    result = json.loads(proc.stdout)
    if result["error"]:
        raise RuntimeError(f"helm render: {result['error']}")
    return [doc for doc in yaml.safe_load_all(result["manifest"]) if doc]


def chart_values(cfg: ScenarioConfig, worker: int, db_url: str, prefix: str, admin_token: str) -> dict[str, Any]:
    """The operator's values for this run; worker `worker` gets its own port."""
    product_repo, product_tag = cfg.product_image.rsplit(":", 1)
    worker_repo, worker_tag = cfg.worker_image.rsplit(":", 1)
    # Two cores or more: one per worker, as `up` binds them; else they share.
    extra = [f"--threads-bind={worker}"] if (os.cpu_count() or 1) >= 2 else []
    return {
        "image": {"repository": product_repo, "tag": product_tag, "pullPolicy": "Never"},
        "adminToken": {"value": admin_token},
        "model": {"dir": f"/models/{cfg.model_dir.name}", "mountPath": "/models"},
        "gateway": {
            "replicas": 1,
            "port": cfg.gateway_port,
            "service": {"port": cfg.gateway_port},
            "settings": {"redisPrefix": prefix},
        },
        "workers": {
            "replicas": 2,
            "port": cfg.worker_ports[worker],
            "image": {"repository": worker_repo, "tag": worker_tag, "pullPolicy": "Never"},
            "hostStore": {"sizeGi": 1},
            "shmHeadroomGi": 1,
            "maxNumSeqs": 16,
            "extraArgs": extra,
        },
        "console": {"port": cfg.console_port, "service": {"port": cfg.console_port}},
        "postgresql": {"enabled": False},
        "externalDatabase": {"url": db_url},
        "redis": {"enabled": False},
        "externalRedis": {"url": cfg.redis_url},
    }


def _with_port(url: str, port: int) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{parts.hostname}:{port}"))


class ChartCluster:
    """The containers of one run; `close()` removes them and the run's database."""

    def __init__(self, cfg: ScenarioConfig, workdir: pathlib.Path) -> None:
        self.cfg = cfg
        self.workdir = workdir
        self.run_id = uuid.uuid4().hex[:8]
        self.db_name = f"ei_containers_{self.run_id}"
        self.prefix = f"ei-containers-{self.run_id}"
        self.admin_token = f"containers-admin-{uuid.uuid4().hex}"
        self.started: list[ContainerRun] = []
        self.report: dict[str, Any] = {}

    # -- set-up ------------------------------------------------------------------
    def _db_url(self) -> str:
        base = urlsplit(self.cfg.postgres_admin_url)
        return urlunsplit(base._replace(scheme="postgresql+psycopg", path=f"/{self.db_name}"))

    def create_database(self) -> None:
        import psycopg

        with psycopg.connect(self.cfg.postgres_admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.db_name}"')

    def plan(self) -> tuple[list[ContainerRun], list[ContainerRun], dict[str, str]]:
        """(gateway pod containers incl. db-upgrade, worker containers, add-hosts)."""
        renders = [
            render(chart_values(self.cfg, i, self._db_url(), self.prefix, self.admin_token), self.workdir)
            for i in range(2)
        ]
        self.objects = renders[0]
        full = f"{RELEASE}-evolving-infra"
        sts = find_object(renders[0], "StatefulSet", f"{full}-worker")
        peers = f"{full}-worker-peers"
        workers = []
        hosts = dict.fromkeys(service_hosts(renders[0], NAMESPACE), "127.0.0.1")
        # One release has one Secret. Each render draws its own random cluster
        # token (the chart's `lookup` finds no Secret outside a cluster), so every
        # pod takes the first render's Secret: with its own render's, worker 1
        # refused the gateway's heartbeats (401) and never joined the cluster.
        secrets = secrets_of(renders[0])
        for i, objects in enumerate(renders):
            pod = f"{full}-worker-{i}"
            workers += pod_containers(find_object(objects, "StatefulSet", f"{full}-worker"), pod, secrets)
            for host in (f"{pod}.{peers}", f"{pod}.{peers}.{NAMESPACE}", f"{pod}.{peers}.{NAMESPACE}.svc"):
                hosts[host] = "127.0.0.1"
        assert sts["spec"]["replicas"] == 2
        gateway = pod_containers(find_object(renders[0], "Deployment", f"{full}-gateway"), f"{full}-gateway-0", secrets)
        console = pod_containers(find_object(renders[0], "Deployment", f"{full}-console"), f"{full}-console-0", secrets)
        for run in gateway:
            if "EVOLVING_WORKER_URLS" in run.env:
                urls = run.env["EVOLVING_WORKER_URLS"].split(",")
                if len(urls) != 2 or not all(f"{full}-worker-{i}." in u for i, u in enumerate(urls)):
                    raise RuntimeError(f"chart's EVOLVING_WORKER_URLS names other pods: {urls}")
                ported = ",".join(_with_port(u, self.cfg.worker_ports[i]) for i, u in enumerate(urls))
                run.env["EVOLVING_WORKER_URLS"] = ported
        return gateway + console, workers, hosts

    def volumes(self, run: ContainerRun) -> dict[str, VolumeBinding]:
        out = {}
        for mount in run.mounts:
            if "persistentVolumeClaim" in mount.source:
                out[mount.volume] = VolumeBinding(host_path=str(self.cfg.model_dir.parent.resolve()))
            elif mount.memory_backed:
                out[mount.volume] = VolumeBinding(tmpfs_bytes=mount.size_limit_bytes)
            elif "emptyDir" in mount.source:
                # An emptyDir per pod and volume, shared by the pod's containers.
                path = self.workdir / run.pod / mount.volume
                path.mkdir(parents=True, exist_ok=True)
                path.chmod(0o777)
                out[mount.volume] = VolumeBinding(host_path=str(path))
        return out

    def start(self, run: ContainerRun, hosts: dict[str, str]) -> None:
        podman.remove(run.container_name)
        args = run.podman_args(self.volumes(run), hosts)
        if run.init:
            proc = podman.podman("run", "--rm", *args, check=False, timeout=600)
            if proc.returncode != 0:
                raise podman.PodmanError(f"{run.container_name} failed: {proc.stdout[-1500:]}{proc.stderr[-1500:]}")
            return
        podman.podman("run", "-d", *args)
        self.started.append(run)

    def kv_agent(self, run: ContainerRun) -> dict[str, Any]:
        """The worker's KV pool agent (`GET /internal/kv/agent`): a NIXL agent
        has a name and a descriptor; a worker without one answers 404."""
        headers = {"Authorization": f"Bearer {run.env.get('EVOLVING_CLUSTER_TOKEN', '')}"}
        r = httpx.get(f"http://127.0.0.1:{run.ports['http']}/internal/kv/agent", headers=headers, timeout=10)
        if r.status_code != 200:
            return {"nixl": False, "status": r.status_code, "body": r.text[:300]}
        info = r.json()
        return {"nixl": bool(info["agent_name"] and info["metadata_b64"]), "agent_name": info["agent_name"]}

    def model_mount(self, run: ContainerRun) -> dict[str, Any]:
        """Where the running container has the chart's model volume, and whether read-only
        (podman's own record of the mount, not the arguments it was given)."""
        target = next(m.target for m in run.mounts if m.volume == "model")
        mount = next(m for m in podman.inspect(run.container_name)["Mounts"] if m["Destination"] == target)
        return {"target": target, "read_only": not mount["RW"]}

    def process_state(self, run: ContainerRun) -> dict[str, Any]:
        """The container's process: `Pid`, `StartedAt`, `Running` (podman's State)."""
        state: dict[str, Any] = podman.inspect(run.container_name)["State"]
        return state

    def start_all(self, pods: list[ContainerRun], workers: list[ContainerRun], hosts: dict[str, str]) -> dict[str, Any]:
        """Start the workers, then the pods (db-upgrade runs to completion first), each waited
        ready in turn; `started`, `ready_s` per container and `start_s` for the report."""
        ready: dict[str, float] = {}
        start = time.monotonic()
        for run in workers:
            self.start(run, hosts)
        for run in workers:
            ready[run.container_name] = round(self.wait_ready(run), 1)
        for run in pods:
            self.start(run, hosts)
            if not run.init:
                ready[run.container_name] = round(self.wait_ready(run), 1)
        return {"started": True, "ready_s": ready, "start_s": round(time.monotonic() - start, 1)}

    def wait_ready(self, run: ContainerRun) -> float:
        assert run.readiness is not None, f"{run.container_name} has no readiness probe in the chart"
        url = f"http://127.0.0.1:{run.readiness.port}{run.readiness.path}"
        return podman.wait_ready(run.container_name, url, self.cfg.ready_timeout_s)

    # -- teardown ------------------------------------------------------------------
    def close(self) -> None:
        for run in self.started:
            podman.remove(run.container_name)
        try:
            import psycopg

            with psycopg.connect(self.cfg.postgres_admin_url, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{self.db_name}" WITH (FORCE)')
            import redis

            client = redis.Redis.from_url(self.cfg.redis_url)
            keys = list(client.scan_iter(match=f"{self.prefix}*", count=1000))
            if keys:
                client.delete(*keys)
        except Exception as exc:  # noqa: BLE001 - cleanup must not hide the run's own result
            print(f"chart_scenario: cleanup: {exc!r}", file=sys.stderr)


def run_scenario(cfg: ScenarioConfig, workdir: pathlib.Path | None = None) -> dict[str, Any]:
    """Start, use and stop the chart's containers; the report (see docs/operations.md)."""
    from testing.chart_traffic import exercise

    own_dir = workdir is None
    workdir = workdir or pathlib.Path(tempfile.mkdtemp(prefix="ei-containers-"))
    cluster = ChartCluster(cfg, workdir)
    report: dict[str, Any] = {
        "started": False,
        "request_ok": False,
        "switch_ok": False,
        "read_only_root": False,
        "nixl_ok": False,
    }
    try:
        unreadable = [p.name for p in cfg.model_dir.iterdir() if p.is_file() and not p.stat().st_mode & 0o004]
        if unreadable:
            # The chart's workers run as uid 10001: a root-only file fails the
            # engine minutes later with a PermissionError deep in its log.
            raise PermissionError(f"{cfg.model_dir}: {unreadable} not readable by other users (chmod o+r)")
        cluster.create_database()
        pods, workers, hosts = cluster.plan()
        runs = pods + workers
        report["images_checked"] = {
            image: check_image(image, [r for r in runs if r.image == image])
            for image in sorted({r.image for r in runs})
        }
        report.update(cluster.start_all(pods, workers, hosts))
        writes = {r.container_name: check_writes(r) for r in cluster.started}
        report["writes"] = writes
        chart_ro = [r for r in cluster.started if r.read_only_root]
        report["read_only_root"] = bool(chart_ro) and all(writes[r.container_name]["ok"] for r in chart_ro)
        report["read_only_containers"] = [r.container_name for r in chart_ro]
        # The KV pool's transport: every worker image must load NIXL and its UCX backend.
        report["model_mounts"] = {r.container_name: cluster.model_mount(r) for r in workers}
        report["kv_agents"] = {r.container_name: cluster.kv_agent(r) for r in workers}
        report["nixl_ok"] = all(a["nixl"] for a in report["kv_agents"].values())
        gateway = next(r for r in pods if r.name == "gateway" and not r.init)
        report.update(exercise(cluster, gateway, workers))
        stops: dict[str, Any] = {}
        start = time.monotonic()
        for run in sorted(cluster.started, key=lambda r: r.name != "console" and r.name != "gateway"):
            seconds, code = podman.stop(run.container_name, run.grace_s)
            stops[run.container_name] = {"s": round(seconds, 1), "exit": code}
        report["stop_s"] = round(time.monotonic() - start, 1)
        report["stops"] = stops
        # SIGKILL after the grace period shows as 137; a clean stop exits by itself.
        report["clean_stop"] = all(s["exit"] != 137 for s in stops.values())
        return report
    finally:
        cluster.close()
        if own_dir:
            import shutil

            shutil.rmtree(workdir, ignore_errors=True)
