"""How much a step slows when its engine gets less of the CPU.

A step that needs C CPU-ms and gets a share s of its core would take C / s
wall ms if every waiting moment were the step's own. The measured share
(`IterationRecord.cpu_share`, ran / (ran + waited) over the engine
process's threads) is coarser than that: it covers every thread of the
engine (some wait while the compute thread runs, without slowing it) and
the sampling interval around the step, not the step itself. So the model
learns the elasticity instead of assuming it:

    wall ≈ wall_at_ref · (share_ref / s)^gamma

``share_ref`` is the typical share (exponentially weighted mean), and
``gamma`` the least-squares slope of the log error of the typical-share
prediction on log(share_ref / s), clipped to [0, 1] (0: the measured share
says nothing; 1: the step is pure CPU time on a shared core). The slope
is attenuated by the share's measurement noise, which is what a predictor
fed with noisy shares should use. On one `bench planner` run's records
(2 cores shared with other jobs) it settled at 0.20 (prefill) and 0.24
(decode); taking gamma = 1 instead made the prefill hold-out error 0.205
against 0.079.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Shares below this are a stalled engine, not a slower one: dividing by them
# would turn one descheduled step into a 20x "faster" sample.
MIN_SHARE = 0.05
MIN_SAMPLES = 50  # shares seen before gamma is used (until then: 0)


def clip_share(share: float | None) -> float | None:
    if share is None or not math.isfinite(share):
        return None
    return min(max(share, MIN_SHARE), 1.0)


@dataclass
class ShareEffect:
    """Typical share and elasticity (module doc); ``memory``: samples over
    which old ones fade."""

    memory: float = 1000.0
    ref: float = 1.0
    seen: int = 0
    sxx: float = 0.0  # exponentially weighted mean of l², l = log(ref / s)
    sxy: float = 0.0  # ... of l · log error

    def observe(self, share: float) -> None:
        """Count one measured share into the typical one."""
        self.seen += 1
        self.ref += (share - self.ref) / min(float(self.seen), self.memory)

    def learn(self, share: float, log_error: float) -> None:
        """One step's log(wall / typical-share prediction) at ``share``."""
        if not math.isfinite(log_error):
            return
        lx = math.log(self.ref / share)
        rate = 1.0 / min(float(self.seen), self.memory)
        self.sxx += rate * (lx * lx - self.sxx)
        self.sxy += rate * (lx * log_error - self.sxy)

    @property
    def gamma(self) -> float:
        if self.seen < MIN_SAMPLES or self.sxx <= 0:
            return 0.0
        return min(max(self.sxy / self.sxx, 0.0), 1.0)

    def factor(self, share: float | None) -> float:
        """Wall time at ``share`` over wall time at the typical share (1 when unknown)."""
        return 1.0 if share is None else (self.ref / share) ** self.gamma
