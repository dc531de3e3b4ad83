"""Start and stop local worker processes (benchmarks, tests, `evolving-infra up`)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

import httpx


@dataclass
class WorkerProcess:
    port: int
    phase: str
    model: str
    node_id: str
    extra: list[str] = field(default_factory=list)
    threads_bind: str | None = None
    log_path: str | None = None
    proc: subprocess.Popen | None = None
    env: dict[str, str] = field(default_factory=dict)  # added to this process's environment

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> WorkerProcess:
        cmd = [
            sys.executable,
            "-m",
            "workers.cli",
            "--model",
            self.model,
            "--port",
            str(self.port),
            "--phase",
            self.phase,
            "--node-id",
            self.node_id,
            *self.extra,
        ]
        if self.threads_bind:
            cmd += ["--threads-bind", self.threads_bind]
        # Own process group: stopping it takes vLLM's engine children along. The child holds
        # its own copy of the log file.
        with open(self.log_path or os.devnull, "ab") as out:
            self.proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
            )
        return self

    def wait_ready(self, timeout: float = 240.0) -> float:
        """Block until /readyz answers 200; returns seconds waited."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"worker {self.node_id} exited with {self.proc.returncode} (log: {self.log_path})")
            try:
                if httpx.get(self.url + "/readyz", timeout=2.0).status_code == 200:
                    return time.monotonic() - start
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"worker {self.node_id} not ready after {timeout}s (log: {self.log_path})")

    def stop(self, timeout: float = 20.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        pgid = os.getpgid(self.proc.pid)
        os.killpg(pgid, signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            self.proc.wait(5)
        # vLLM's engine children may outlive the server by a moment.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)

    def kill(self) -> None:
        """Hard crash (SIGKILL the whole group): for fault tests."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(os.getpgid(self.proc.pid), signal.SIGKILL)
            self.proc.wait(5)
