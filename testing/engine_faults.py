"""Faults of a real worker's engine, for tests and `bench chaos`.

vLLM runs a worker's engine core as a child process (titled
"VLLM::EngineCore"); killing it with SIGKILL is what the kernel's OOM killer
does to the biggest process, and leaves the worker's own process (HTTP,
host-side state) alive with a dead engine.
"""

from __future__ import annotations

import os
import signal

import psutil  # vLLM's own dependency

ENGINE_TITLE = "EngineCore"


def engine_core_pids(worker_pid: int) -> list[int]:
    """The engine-core processes under a worker process (children at any depth)."""
    try:
        kids = psutil.Process(worker_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    out = []
    for p in kids:
        try:
            if ENGINE_TITLE in p.name() or ENGINE_TITLE in " ".join(p.cmdline()):
                out.append(p.pid)
        except psutil.Error:
            continue
    return out


def kill_engine(worker_pid: int, sig: signal.Signals = signal.SIGKILL) -> int:
    """Kill the worker's engine core (OOM-style by default); returns its pid."""
    pids = engine_core_pids(worker_pid)
    if not pids:
        raise LookupError(f"no engine-core process under worker {worker_pid}")
    os.kill(pids[0], sig)
    return pids[0]
