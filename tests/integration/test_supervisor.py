"""`cli.supervisor` with real processes (no vLLM): a taken port is an error
naming it, and stopping leaves no process and no listener behind — not the
grandchild a child spawned (as Streamlit under a wrapper, or vLLM's engine
core under a worker), not a child that ignores SIGTERM, not even after the
supervisor itself was SIGKILLed."""

from __future__ import annotations

import os
import pathlib
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from cli.supervisor import Children, PortClaim, PortInUse, check_ports, group_alive, port_free
from testing.stacks import free_port

LISTEN = "import socket, sys, time; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
LISTEN += "s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); time.sleep(600)"


def wait_until(cond, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_check_ports_names_the_taken_port_and_its_option() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert not port_free("127.0.0.1", port)
        with pytest.raises(PortInUse) as exc:
            check_ports([PortClaim(free_port(), "gateway", "--port"), PortClaim(port, "console", "--console-port")])
        assert f"port {port} (console) is already in use" in str(exc.value) and "--console-port" in str(exc.value)
    assert port_free("127.0.0.1", port)  # closed: free again
    with pytest.raises(PortInUse, match="asked for twice: gateway \\(--port\\) and console"):
        check_ports([PortClaim(port, "gateway", "--port"), PortClaim(port, "console", "--console-port")])
    with pytest.raises(PortInUse, match="not a valid port"):
        check_ports([PortClaim(70000, "gateway", "--port")])


def test_stop_ends_the_whole_group_including_a_grandchild_listener(tmp_path: pathlib.Path) -> None:
    port = free_port()
    # A wrapper that starts the listener as its own child, like `evolving-infra console` did.
    wrapper = (
        f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {LISTEN!r}, '{port}']); time.sleep(600)"
    )
    children = Children()
    children.start("console", [sys.executable, "-c", wrapper], tmp_path / "console.log")
    wait_until(lambda: listening(port))
    pgid = children.procs[0][1].pid
    children.stop(grace_s=5)
    assert not listening(port) and port_free("127.0.0.1", port)
    assert not group_alive(pgid)


def test_a_child_ignoring_sigterm_is_killed_after_the_grace_period(tmp_path: pathlib.Path) -> None:
    port = free_port()
    stubborn = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); " + LISTEN
    children = Children()
    children.start("w0", [sys.executable, "-c", stubborn, str(port)], tmp_path / "w0.log")
    wait_until(lambda: listening(port))
    t0 = time.monotonic()
    children.stop(grace_s=1.0)
    assert time.monotonic() - t0 < 8 and not listening(port)


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux-only")
def test_children_die_with_a_supervisor_that_was_sigkilled(tmp_path: pathlib.Path) -> None:
    port = free_port()
    script = textwrap.dedent(
        f"""
        import pathlib, sys, time
        sys.path.insert(0, {str(pathlib.Path(__file__).resolve().parents[2])!r})
        from cli.supervisor import Children
        c = Children()
        c.start("w0", [sys.executable, "-c", {LISTEN!r}, "{port}"], pathlib.Path({str(tmp_path / "w0.log")!r}))
        time.sleep(600)
        """
    )
    supervisor = subprocess.Popen([sys.executable, "-c", script])
    try:
        wait_until(lambda: listening(port))
        os.kill(supervisor.pid, signal.SIGKILL)
        supervisor.wait(10)
        wait_until(lambda: not listening(port), timeout_s=10)
    finally:
        if supervisor.poll() is None:
            supervisor.kill()


def test_the_console_command_stops_streamlit_on_sigterm(tmp_path: pathlib.Path) -> None:
    """`evolving-infra console` run on its own and stopped with SIGTERM leaves no Streamlit behind."""
    port = free_port()
    root = pathlib.Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "console", "--port", str(port), "--admin-url", "http://127.0.0.1:9"],
        cwd=root,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_until(lambda: listening(port), timeout_s=60)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) in (0, -signal.SIGTERM, 143)
        wait_until(lambda: not listening(port), timeout_s=10)
        assert not group_alive(proc.pid)
    finally:
        if group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
