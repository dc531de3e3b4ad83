"""How fast the gateway takes a node whose engine died out of routing.

`DeathWatch` polls, every `period_s` (20 ms), each worker's engine-core
processes (psutil, as `testing.engine_faults` finds them) and the
gateway's own registry (the gateway runs in this process). A worker's
engine died at the last moment its engine-core process was seen alive
before it was seen gone (or a zombie): an upper bound, late by at most one
period plus the look itself. The gateway took the node out at its own
timestamp (`WorkerNode.unhealthy_since`, unix s). `detect_s` of a window is
the longest gap between the two over the engines that died: the time a
dead engine stayed in routing, measured, not a poll's floor.

The fault may take the node out before its engine-core process has gone
(a core that crashes reports its death, then exits once the worker shuts
its client down, up to 2 s later): then the gap is negative and counts as
0. Only exits after the engine was first seen count (a restarted core is a
new engine).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil

from testing.engine_faults import engine_core_pids


@dataclass
class _Engine:
    pid: int
    alive_at: float  # unix s it was last seen alive
    seen_at: float  # unix s it was first seen (a restarted core is a new engine)


@dataclass
class DeathWatch:
    workers: dict[str, Any]  # node id -> WorkerProcess (its `proc`)
    registry: Callable[[], Any]  # the gateway's WorkerRegistry now (a restarted gateway has a new one)
    period_s: float = 0.02
    engines: dict[str, _Engine] = field(default_factory=dict)
    deaths: list[tuple[str, float, float]] = field(default_factory=list)  # (node, died at, first seen) per death
    out_at: dict[str, list[float]] = field(default_factory=dict)  # node -> the gateway's out-of-routing times
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        while not self._stop.is_set():
            await asyncio.to_thread(self._look_engines)
            self._look_gateway()
            await asyncio.sleep(self.period_s)

    def _look_engines(self) -> None:
        for node, w in self.workers.items():
            now = time.time()
            known = self.engines.get(node)
            if known is not None and _alive(known.pid):
                known.alive_at = now
                continue
            if known is not None:
                self.deaths.append((node, known.alive_at, known.seen_at))
                del self.engines[node]
            proc = getattr(w, "proc", None)
            pids = [p for p in engine_core_pids(proc.pid) if _alive(p)] if proc is not None else []
            if pids:
                self.engines[node] = _Engine(pids[0], now, now)

    def _look_gateway(self) -> None:
        try:
            nodes = self.registry().nodes()
        except (AttributeError, RuntimeError):  # the gateway is restarting
            return
        for n in nodes:
            since = n.unhealthy_since
            if since is not None and since not in self.out_at.setdefault(n.node_id, []):
                self.out_at[n.node_id].append(since)

    def stop(self) -> None:
        self._stop.set()

    def detect_s(self) -> float | None:
        """The longest a dead engine stayed in routing (None: none died, or
        the gateway never took its node out)."""
        # Each node's first exit from routing while that engine ran: a crashing
        # core reports its death, then its process lingers until the worker
        # shuts its client down (up to the healer's 2 s drain).
        gaps = self.gaps()
        return max(0.0, max(gaps)) if gaps else None

    def gaps(self) -> list[float]:
        """Per engine that died and was taken out: out-of-routing time minus
        its last sign of life, signed (negative: out before its process exited)."""
        out = []
        for node, died, seen in self.deaths:
            outs = [t for t in self.out_at.get(node, []) if t >= seen]
            if outs:
                out.append(round(min(outs) - died, 3))
        return out

    def first_death(self) -> float | None:
        return min(t for _, t, _ in self.deaths) if self.deaths else None


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
