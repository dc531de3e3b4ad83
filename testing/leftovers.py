"""What a stopped `evolving-infra up` left behind: ports of the run that
still accept a connection, and processes whose command line still names the
run's data folder (workers, vLLM's engine cores and the console all get it).

`bench demo` reports the counts (`listeners_after_stop`,
`processes_after_stop`); tests/integration/test_up_stop.py asserts both are
empty.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import socket
from collections.abc import Iterable
from dataclasses import dataclass


def listening(port: int, host: str = "127.0.0.1") -> bool:
    """True when something accepts a TCP connection on `host:port` now."""
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex((host, port)) == 0


def processes_naming(text: str) -> list[int]:
    """Pids (not this process) whose command line contains `text`."""
    found = []
    for d in pathlib.Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            with contextlib.suppress(OSError):
                if text in (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    found.append(int(d.name))
    return found


@dataclass(frozen=True)
class Leftovers:
    listeners: tuple[int, ...]  # the run's ports still listening
    processes: tuple[int, ...]  # pids still naming the run's data folder


def left_after_stop(ports: Iterable[int], data_dir: str | os.PathLike[str]) -> Leftovers:
    """Probe once, after `up` has exited: who still listens, who still runs."""
    return Leftovers(
        listeners=tuple(p for p in ports if listening(p)),
        processes=tuple(processes_naming(str(data_dir))),
    )
