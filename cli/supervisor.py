"""The processes `evolving-infra up` starts, and the ports they need.

Each child runs in its own session, so its whole process group — vLLM's
engine-core process under a worker, anything a child spawns — is signalled
together: `Children.stop` sends SIGTERM to every group, waits for the
groups to be empty, and SIGKILLs what is left after the grace period. On
Linux a child also gets SIGTERM if `up` itself dies without stopping it
(`PR_SET_PDEATHSIG`), e.g. when it is killed with SIGKILL.

`check_ports` runs before anything starts: a port something else listens
on is a `PortInUse` naming the port, who needed it and the option that
moves it, instead of a child that fails later in its log.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class PortClaim:
    port: int
    what: str  # "gateway", "worker w0", "console"
    option: str  # the flag that moves it, e.g. "--console-port"
    host: str = "127.0.0.1"


class PortInUse(Exception):
    """A port `up` needs is taken (or claimed twice)."""


def port_free(host: str, port: int) -> bool:
    """True when a listener could bind `host:port` now (as uvicorn and
    Streamlit do, with SO_REUSEADDR: a port in TIME_WAIT counts as free)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def check_ports(claims: Sequence[PortClaim], free: Callable[[str, int], bool] = port_free) -> None:
    """Raise `PortInUse` for the first claim that clashes with another or is taken."""
    seen: dict[int, PortClaim] = {}
    for c in claims:
        if not 1 <= c.port <= 65535:
            raise PortInUse(f"port {c.port} for the {c.what} is not a valid port ({c.option})")
        if c.port in seen:
            other = seen[c.port]
            raise PortInUse(
                f"port {c.port} is asked for twice: {other.what} ({other.option}) and {c.what} ({c.option})"
            )
        seen[c.port] = c
    for c in claims:
        if not free(c.host, c.port):
            raise PortInUse(
                f"port {c.port} ({c.what}) is already in use on {c.host}: stop what listens there "
                f"(`ss -ltnp 'sport = :{c.port}'` shows it) or pass {c.option} with a free port"
            )


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    libc_name = ctypes.util.find_library("c")
    if libc_name:
        ctypes.CDLL(libc_name, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def group_alive(pgid: int) -> bool:
    """Whether any process of group `pgid` still exists (zombies of it included)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class Children:
    procs: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)
    logs: dict[str, pathlib.Path] = field(default_factory=dict)

    def start(self, name: str, argv: list[str], log: pathlib.Path, env: dict[str, str] | None = None) -> None:
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # its own process group: stopped as a whole
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        self.procs.append((name, proc))
        self.logs[name] = log

    def start_attached(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        """A child whose output goes to this terminal (the load's progress), in its own group too."""
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        self.procs.append((name, proc))

    def get(self, name: str) -> subprocess.Popen[bytes] | None:
        return next((p for n, p in self.procs if n == name), None)

    def signal(self, name: str, sig: signal.Signals) -> None:
        """Send `sig` to child `name`'s process group now (no wait; no-op if absent)."""
        proc = self.get(name)
        if proc is not None and proc.poll() is None:
            _signal_group(proc.pid, sig)

    def dead(self, names: Sequence[str] | None = None) -> list[str]:
        return [n for n, p in self.procs if (names is None or n in names) and p.poll() is not None]

    def stop(self, grace_s: float = 10.0, names: Sequence[str] | None = None) -> None:
        """SIGTERM every child's process group, then SIGKILL what outlives `grace_s`."""
        chosen = [(n, p) for n, p in self.procs if names is None or n in names]
        for _, p in chosen:
            _signal_group(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for _, p in chosen:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(max(0.1, deadline - time.monotonic()))
        # The leader may be gone while its group lives on (a grandchild); wait for the group.
        while any(group_alive(p.pid) for _, p in chosen) and time.monotonic() < deadline:
            time.sleep(0.1)
        for _, p in chosen:
            if p.poll() is None or group_alive(p.pid):
                _signal_group(p.pid, signal.SIGKILL)
                p.wait()
        end = time.monotonic() + 5.0
        while any(group_alive(p.pid) for _, p in chosen) and time.monotonic() < end:
            time.sleep(0.05)  # SIGKILLed grandchildren are reaped by init; give it a moment
        if names is None:
            self.procs.clear()
        else:
            self.procs = [(n, p) for n, p in self.procs if n not in names]


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def tail(path: pathlib.Path, lines: int = 5) -> str:
    """The last lines of a log, indented, for an error message."""
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return "\n".join("    " + ln for ln in text[-lines:])
