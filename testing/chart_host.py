"""The chart's containers as processes on this host, without images.

The same plan as tests/containers (testing.chart_scenario: the rendered
chart's commands, args and environment for the `db upgrade` init container,
two workers, the gateway and the console) and the same traffic
(testing.chart_traffic), run from this checkout's `evolving-infra`: what the
product does under the chart's settings can then be seen and tested without
a 40-minute image build, where podman is missing, and in `make test`.

What stands in for the pod, and nothing else: each volume the chart mounts
is a host folder (the model volume is the model's parent folder, an emptyDir
a fresh folder per pod, a memory-backed one stays /dev/shm), and a path under
a mount target in an argument or environment value is rewritten to that
folder; the release's DNS names become 127.0.0.1. Not shown here: the image's
contents, the user, the read-only root filesystem (tests/containers).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

import httpx

from testing.chart_pods import ContainerRun
from testing.chart_scenario import ChartCluster, ScenarioConfig


class HostProcessError(RuntimeError):
    """A chart container's process failed on the host; the message holds its log tail."""


def rewrite(text: str, paths: dict[str, str], hosts: list[str]) -> str:
    """`text` with paths under a mount target moved to their host folder and the
    release's host names made 127.0.0.1 (only inside URLs: `//name:` or `//name/`)."""
    for target in sorted(paths, key=len, reverse=True):
        text = re.sub(rf"(?<![\w./-]){re.escape(target)}(?=/|$|[\s,:;])", paths[target], text)
    for host in sorted(hosts, key=len, reverse=True):
        text = re.sub(rf"//{re.escape(host)}(?=[:/]|$)", "//127.0.0.1", text)
    return text


class HostCluster(ChartCluster):
    """ChartCluster whose containers are host processes (same plan, same traffic)."""

    def __init__(self, cfg: ScenarioConfig, workdir: pathlib.Path) -> None:
        super().__init__(cfg, workdir)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.started_at: dict[str, float] = {}
        self.bin = pathlib.Path(sys.executable).parent
        # The pods' folders: short, as a worker binds unix sockets in its run folder.
        self.pods_dir = pathlib.Path(tempfile.mkdtemp(prefix="ei-pods-"))

    def paths(self, run: ContainerRun) -> dict[str, str]:
        """Mount target -> host folder for this container."""
        out = {}
        for mount in run.mounts:
            if "persistentVolumeClaim" in mount.source:
                out[mount.target] = str(self.cfg.model_dir.parent.resolve())
            elif mount.memory_backed:
                out[mount.target] = mount.target  # /dev/shm: the host's
            elif "emptyDir" in mount.source:
                path = self.pods_dir / "-".join(run.pod.split("-")[-2:]) / mount.volume
                path.mkdir(parents=True, exist_ok=True)
                out[mount.target] = str(path)
        return out

    def log_path(self, run: ContainerRun) -> pathlib.Path:
        return self.workdir / f"{run.container_name}.log"

    def command(self, run: ContainerRun, hosts: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        paths, names = self.paths(run), list(hosts)
        argv = [rewrite(a, paths, names) for a in run.command + run.args]
        if argv and "/" not in argv[0]:
            argv[0] = str(self.bin / argv[0])  # the image's PATH: this venv's scripts
        home = self.pods_dir / "-".join(run.pod.split("-")[-2:]) / "home"
        home.mkdir(parents=True, exist_ok=True)
        env = {k: os.environ[k] for k in ("PATH", "PYTHONPATH", "LANG", "TMPDIR") if k in os.environ}
        env.update(HOME=str(home), PYTHONUNBUFFERED="1")
        env.update({k: rewrite(v, paths, names) for k, v in run.env.items()})
        return argv, env

    def start(self, run: ContainerRun, hosts: dict[str, str]) -> None:
        argv, env = self.command(run, hosts)
        log = self.log_path(run).open("ab")
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        if run.init:
            if proc.wait(timeout=600) != 0:
                raise HostProcessError(f"{run.container_name} exited {proc.returncode}:\n{self.logs(run)}")
            return
        self.procs[run.container_name] = proc
        self.started_at[run.container_name] = time.time()
        self.started.append(run)

    def logs(self, run: ContainerRun, tail: int = 60) -> str:
        path = self.log_path(run)
        lines = path.read_text(errors="replace").splitlines() if path.exists() else []
        return "\n".join(lines[-tail:])

    def wait_ready(self, run: ContainerRun) -> float:
        assert run.readiness is not None, f"{run.container_name} has no readiness probe in the chart"
        url = f"http://127.0.0.1:{run.readiness.port}{run.readiness.path}"
        proc = self.procs[run.container_name]
        start = time.monotonic()
        while time.monotonic() - start < self.cfg.ready_timeout_s:
            try:
                if httpx.get(url, timeout=3).status_code == 200:
                    return time.monotonic() - start
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                raise HostProcessError(f"{run.container_name} exited before it was ready:\n{self.logs(run)}")
            time.sleep(1)
        raise HostProcessError(f"{run.container_name} not ready at {url}:\n{self.logs(run)}")

    def process_state(self, run: ContainerRun) -> dict[str, Any]:
        proc = self.procs[run.container_name]
        return {"Pid": proc.pid, "StartedAt": self.started_at[run.container_name], "Running": proc.poll() is None}

    def stop(self, run: ContainerRun) -> tuple[float, int]:
        """SIGTERM to the main process (as the kubelet to PID 1), SIGKILL to all
        after the chart's grace period: (seconds, exit code; 137 when killed)."""
        proc = self.procs[run.container_name]
        start = time.monotonic()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=run.grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return time.monotonic() - start, 137
        return time.monotonic() - start, proc.returncode

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.started.clear()
        shutil.rmtree(self.pods_dir, ignore_errors=True)
        super().close()


def run_on_host(cfg: ScenarioConfig, workdir: pathlib.Path) -> dict[str, Any]:
    """Start, use and stop the chart's containers as host processes; the report
    has the keys of run_scenario's but for the image checks."""
    from testing.chart_traffic import exercise

    cluster = HostCluster(cfg, workdir)
    report: dict[str, Any] = {"started": False, "request_ok": False, "switch_ok": False, "workdir": str(workdir)}
    try:
        cluster.create_database()
        pods, workers, hosts = cluster.plan()
        report.update(cluster.start_all(pods, workers, hosts))
        gateway = next(r for r in pods if r.name == "gateway" and not r.init)
        report.update(exercise(cluster, gateway, workers))
        stops = {}
        for run in sorted(cluster.started, key=lambda r: r.name not in ("console", "gateway")):
            seconds, code = cluster.stop(run)
            stops[run.container_name] = {"s": round(seconds, 1), "exit": code}
        report["stops"] = stops
        report["clean_stop"] = all(s["exit"] != 137 for s in stops.values())
        return report
    finally:
        cluster.close()
