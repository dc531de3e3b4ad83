"""`evolving-infra up` as a user runs it: a taken port stops the start with an
error naming it (no vLLM needed), and stopping `up` leaves no process and no
listener on any of its ports — workers (with vLLM's engine-core processes)
and the console included (real vLLM engines: marked `vllm`)."""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from cli.supervisor import port_free
from testing.leftovers import Leftovers, left_after_stop, processes_naming
from testing.ports import stable_ports
from testing.stacks import free_ports

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEMO_MODEL = os.environ.get("EVOLVING_TEST_MODEL", str(ROOT / "data" / "tiny-model"))


def up_argv(data: pathlib.Path, gateway: int, worker: int, console: int, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "cli.main",
        "up",
        "--model",
        DEMO_MODEL,
        "--data-dir",
        str(data),
        "--port",
        str(gateway),
        "--worker-port",
        str(worker),
        "--console-port",
        str(console),
        *extra,
    ]


def env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("EVOLVING_")}


def test_a_taken_port_is_a_start_error_naming_it(tmp_path: pathlib.Path) -> None:
    # The gateway's and worker's ports are found free, not held (`up` must find them free):
    # another process may take one before `up` checks it (an outgoing connection's local
    # port). Then `up` rightly names that one; the case runs again on fresh ports.
    for _ in range(3):
        gateway, worker = free_ports(2)
        with socket.socket() as held:
            held.bind(("127.0.0.1", 0))
            held.listen()
            console = held.getsockname()[1]
            t0 = time.monotonic()
            proc = subprocess.run(
                up_argv(tmp_path / "data", gateway, worker, console),
                cwd=ROOT,
                env=env(),
                capture_output=True,
                text=True,
                timeout=120,
            )
        if not any(f"port {port} (" in proc.stderr for port in (gateway, worker)):
            break
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"port {console} (console) is already in use" in proc.stderr and "--console-port" in proc.stderr
    assert "console:" not in proc.stdout  # never a URL for a console that is not ours
    assert not (tmp_path / "data" / "logs").exists()  # nothing was started
    assert time.monotonic() - t0 < 60


@pytest.mark.vllm
def test_stopping_up_stops_every_process_and_frees_every_port(tmp_path: pathlib.Path) -> None:
    data = tmp_path / "data"
    # `up` binds the gateway's port once its workers are up, a minute on: ports that no
    # outgoing connection can take meanwhile (testing.ports).
    gateway, worker, console = stable_ports(3)
    while {worker, worker + 1} & {gateway, console} or not port_free("127.0.0.1", worker + 1):
        worker = stable_ports(1)[0]
    ports = [gateway, worker, worker + 1, console]
    log = tmp_path / "up.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            up_argv(data, gateway, worker, console, "--planner-mode", "auto"),
            cwd=ROOT,
            env=env(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 600
        while "try it:" not in log.read_text(errors="replace"):
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(1)
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{gateway}/readyz", timeout=2).status_code == 200:
                    break
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.5)
        text = log.read_text()
        assert f"console:  http://127.0.0.1:{console}" in text
        assert "planner:  evolving, mode auto (moves the split itself)" in text
        assert "(checked against the store)" in text and '"X-Branch-Finished": "true"' in text
        assert httpx.get(f"http://127.0.0.1:{console}/_stcore/health", timeout=5).status_code == 200
        assert len(processes_naming(str(data))) >= 3  # the workers and the console
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(90) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert [p for p in ports if not port_free("127.0.0.1", p)] == []
    assert left_after_stop(ports, data) == Leftovers(listeners=(), processes=())  # nobody answers, nothing runs
