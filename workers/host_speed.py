"""How fast the host runs a fixed piece of work right now.

A shared host has slow spells that no scheduler counter sees: a neighbour
on the same socket filling the L3 cache and the memory bus, a hypervisor
lowering the clock. The engine gets its whole share of the CPU
(`workers.iterations.CpuShareMeter` reads 1) and its steps still take a
fifth longer for minutes. A model fitted through such a spell learns the
slow host as the usual one and mispredicts the steps after it.

`HostSpeedMeter` times a fixed reference computation (`reference_work`: a
vector multiply-add and sum over 512 KiB, well past the L1 cache, and a
short interpreter loop: the two kinds of work an engine step on CPU does)
in **CPU time of the calling thread**
(``time.thread_time_ns``): time the thread spent waiting for a core is not
in it, so it measures how much work a cycle of this host does, not how busy
the host's other processes keep it (the CPU share's job). One probe costs
about 0.3-0.8 ms and scatters by ~15 % (interrupts, cold caches); it runs at
most every `PROBE_EVERY_S` and a record carries the exponentially weighted
mean of the recent probes (`SMOOTHING`: about the last 8), µs of CPU per
probe. It runs where the worker appends a record (its event loop, on
whatever core the worker's own threads use), so the loop waits about
0.3 ms once a second for it.
The planner learns how much the step time follows it
(`planner.profile.IterationModel`, its ``speed`` elasticity): where the
probe tracks nothing the steps feel, the learned elasticity stays near 0.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

PROBE_EVERY_S = 1.0  # at most one probe per this many seconds: ≤ 0.1 % of a core
SMOOTHING = 0.125  # weight of the newest probe in the carried mean (~8 probes)
_VECTOR = np.arange(1 << 17, dtype=np.float32)  # 512 KiB
_LOOP = 1500


def reference_work() -> float:
    """The fixed computation a probe times (module doc); returns its result so
    nothing is optimised away."""
    total = float((_VECTOR * 1.0001 + 0.5).sum())
    acc = 0
    for i in range(_LOOP):
        acc += i * i
    return total + acc


class HostSpeedMeter:
    """CPU µs of `reference_work`, smoothed over the recent probes (module
    doc). ``clock``: monotonic seconds; ``cpu_ns``: the calling thread's CPU
    nanoseconds; ``work``: the probe (all injectable for tests)."""

    def __init__(
        self,
        every_s: float = PROBE_EVERY_S,
        smoothing: float = SMOOTHING,
        clock: Callable[[], float] = time.monotonic,
        cpu_ns: Callable[[], int] = time.thread_time_ns,
        work: Callable[[], object] = reference_work,
    ) -> None:
        if every_s < 0 or not 0.0 < smoothing <= 1.0:
            raise ValueError("need every_s >= 0 and smoothing in (0, 1]")
        self.every_s = every_s
        self.smoothing = smoothing
        self.clock = clock
        self.cpu_ns = cpu_ns
        self.work = work
        self._probed_at = -float("inf")
        self.probe_us: float | None = None

    def read(self) -> float | None:
        """The smoothed probe cost in CPU µs, probing first when the last
        probe is `every_s` old. None until a probe measured something (no
        per-thread CPU clock on this platform)."""
        now = self.clock()
        if now - self._probed_at < self.every_s:
            return self.probe_us
        self._probed_at = now
        return self.probe()

    def probe(self) -> float | None:
        """Time `work` once in thread CPU µs and fold it into the smoothed value."""
        start = self.cpu_ns()
        self.work()
        cost = (self.cpu_ns() - start) / 1e3
        if cost <= 0:
            return self.probe_us
        prev = self.probe_us
        self.probe_us = cost if prev is None else prev + self.smoothing * (cost - prev)
        return self.probe_us
