"""Workers and the gateway started inside the testbed's hosts.

Each worker binds its host's address (so it needs the cluster token, which
every process here gets from the environment) and reads peers over UCX
limited to TCP on the host's eth0 (`NETWORK_UCX_ENV`); its UCX log (info
level, protocol tables) goes to its log file, where `ucx_transport()` reads
back what UCX actually used. HTTP to a host is made from a thread inside
the calling host's namespace (`Testbed.call_in`), the gateway's seat.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx

from cli.testbed.netns import Testbed, TestbedError
from cli.testbed.plan import NETWORK_UCX_ENV, UcxTransport, parse_ucx_transport

WORKER_PORT = 8400
GATEWAY_PORT = 8000


@dataclass
class Proc:
    """One process of the cluster inside a host."""

    name: str
    host: str
    argv: list[str]
    env: dict[str, str]
    log: pathlib.Path
    url: str
    proc: subprocess.Popen | None = None
    starts: int = 0

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class Cluster:
    tb: Testbed
    model: str
    token: str
    log_dir: pathlib.Path
    run_dir: pathlib.Path
    python: str = sys.executable
    ucx_env: dict[str, str] = field(default_factory=lambda: dict(NETWORK_UCX_ENV))
    procs: dict[str, Proc] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.tb.on_down(self.stop_all)

    def _env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return {"PYTHONUNBUFFERED": "1", "EVOLVING_CLUSTER_TOKEN": self.token, **(extra or {})}

    def add_worker(
        self,
        host: str,
        node_id: str,
        phase: str,
        *,
        cpu: str | None = None,
        port: int = WORKER_PORT,
        args: Sequence[str] = (),
    ) -> Proc:
        addr = self.tb.host(host).addr
        argv = [self.python, "-m", "workers.cli", "--model", self.model, "--host", addr, "--port", str(port)]
        argv += ["--phase", phase, "--node-id", node_id, "--run-dir", str(self.run_dir / node_id), *args]
        if cpu is not None:
            argv += ["--threads-bind", cpu]
        # UCX writes its own log file per process (%p: pid): the engine core,
        # where the pool's NIXL agent lives, is a child whose output may not
        # reach the worker's log.
        ucx_log = str(self.log_dir / f"{node_id}-ucx.%p.log")
        env = self._env({**self.ucx_env, "UCX_LOG_LEVEL": "info", "UCX_PROTO_INFO": "y", "UCX_LOG_FILE": ucx_log})
        p = Proc(node_id, host, argv, env, self.log_dir / f"{node_id}.log", f"http://{addr}:{port}")
        self.procs[node_id] = p
        return p

    def add_gateway(
        self, host: str, worker_urls: list[str], *, port: int = GATEWAY_PORT, env: dict | None = None
    ) -> Proc:
        addr = self.tb.host(host).addr
        argv = [self.python, "-m", "cli.main", "gateway", "--model", self.model, "--host", addr, "--port", str(port)]
        argv += ["--worker-urls", ",".join(worker_urls), "--data-dir", str(self.run_dir / "gateway")]
        p = Proc("gateway", host, argv, self._env(env), self.log_dir / "gateway.log", f"http://{addr}:{port}")
        self.procs["gateway"] = p
        return p

    def start(self, p: Proc) -> Proc:
        cwd = str(pathlib.Path(__file__).resolve().parents[2])  # the repository: `-m workers.cli` resolves
        with open(p.log, "ab") as out:  # the child holds its own copy
            p.proc = self.tb.popen(p.host, p.argv, env=p.env, stdout=out, stderr=subprocess.STDOUT, cwd=cwd)
        p.starts += 1
        return p

    def wait_ready(self, procs: Sequence[Proc], timeout_s: float = 600.0, path: str = "/readyz") -> float:
        """Wait until each answers 200 on `path` (asked from inside its own host)."""
        start = time.monotonic()
        for p in procs:
            while True:
                if p.proc is not None and p.proc.poll() is not None:
                    raise TestbedError(f"{p.name} exited with {p.proc.returncode} (log: {p.log})")
                if self.tb.call_in(p.host, _answers, p.url + path):
                    break
                if time.monotonic() - start > timeout_s:
                    raise TestbedError(f"{p.name} not ready after {timeout_s:.0f} s (log: {p.log})")
                time.sleep(0.5)
        return time.monotonic() - start

    def kill(self, p: Proc) -> None:
        """Crash it: SIGKILL its whole process group (vLLM's engine core too)."""
        _signal_group(p, signal.SIGKILL)
        if p.proc is not None:
            p.proc.wait(10)

    def stop(self, p: Proc, grace_s: float = 20.0) -> None:
        if not p.alive:
            return
        assert p.proc is not None
        _signal_group(p, signal.SIGTERM)
        try:
            p.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            _signal_group(p, signal.SIGKILL)
            p.proc.wait(5)
        _signal_group(p, signal.SIGKILL)  # engine children may outlive the server by a moment

    def stop_all(self) -> None:
        for p in self.procs.values():
            self.stop(p, grace_s=10.0)

    def ucx_transport(self, node_id: str) -> UcxTransport | None:
        """What UCX reported it used for the node's first endpoint to a peer."""
        p = self.procs[node_id]
        logs = [*sorted(self.log_dir.glob(f"{node_id}-ucx.*.log")), p.log]
        for log in logs:
            if log.exists():
                found = parse_ucx_transport(log.read_text(errors="replace"))
                if found is not None:
                    return found
        return None


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def _signal_group(p: Proc, sig: int) -> None:
    if p.proc is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(os.getpgid(p.proc.pid), sig)
