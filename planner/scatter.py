"""The scatter an iteration model sees, as a band that covers it.

A regression's own noise estimate assumes independent, roughly normal
errors. Step times on a shared host are neither: a co-tenant slows a run of
steps together (the errors are correlated), and preemptions give a heavy
tail (the Huber fit clips it out of its variance). `ScatterBand` watches the
model's a-priori relative errors (each predicted before the model learned
from it) and keeps two numbers that do not rely on either assumption:

- ``sigma``: the 68.3 % quantile of |error|, tracked online (the Robbins-
  Monro quantile step, in log space so it adapts at a relative rate). For
  normal errors it is the standard deviation; for heavy tails it is what a
  one-sigma band must be to cover 68.3 % of what the model actually sees.
- ``inflation``: how much the parameter variance under-states itself when
  errors are correlated: under AR(1) errors with lag-one correlation rho, n
  samples carry the information of n·(1 − rho)/(1 + rho) independent ones,
  so the variance scales by (1 + rho)/(1 − rho) (rho clipped to [0, 0.9]:
  negative correlation is not trusted to narrow a band, and beyond 0.9 the
  AR(1) picture no longer holds).

Both forget at the regression's rate, so they describe the recent host.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ONE_SIGMA_COVERAGE = 0.6827  # P(|Z| <= 1) for a standard normal Z
MAX_RHO = 0.9


@dataclass
class ScatterBand:
    """Online relative-error band (module doc). ``memory``: samples over which
    old errors fade (≈ 1 / (1 − forgetting) of the regression)."""

    memory: float = 1000.0
    log_q: float = math.log(0.05)  # start: a 5 % band, until errors say otherwise
    count: int = 0
    _m2: float = 0.0  # exponentially weighted mean of e_t²
    _lag: float = 0.0  # ... of e_t · e_(t-1)
    _last: float | None = None

    def update(self, error: float) -> None:
        """Add one a-priori relative error (observed / predicted − 1)."""
        if not math.isfinite(error):
            return
        self.count += 1
        rate = 1.0 / min(float(self.count), self.memory)
        # Quantile step: up by p when outside, down by 1 − p when inside, so
        # the band settles where a fraction p of errors falls inside. Never
        # slower than a 50-sample horizon: the band follows the host's level.
        step = min(max(rate, 0.02), 0.2)
        outside = abs(error) > math.exp(self.log_q)
        self.log_q += step * (ONE_SIGMA_COVERAGE if outside else ONE_SIGMA_COVERAGE - 1.0)
        clipped = max(-1.0, min(1.0, error))  # a 10x preemption must not own the correlation
        self._m2 += rate * (clipped * clipped - self._m2)
        if self._last is not None:
            self._lag += rate * (clipped * self._last - self._lag)
        self._last = clipped

    @property
    def sigma(self) -> float:
        """Relative one-sigma band (fraction of the prediction)."""
        return math.exp(self.log_q)

    @property
    def rho(self) -> float:
        """Lag-one correlation of the errors, clipped to [0, MAX_RHO]."""
        if self.count < 3 or self._m2 <= 0:
            return 0.0
        return min(max(self._lag / self._m2, 0.0), MAX_RHO)

    @property
    def inflation(self) -> float:
        """Factor on the parameter variance for correlated errors (≥ 1)."""
        r = self.rho
        return (1.0 + r) / (1.0 - r)

    def to_dict(self) -> dict[str, float | int | None]:
        return {
            "memory": self.memory,
            "log_q": self.log_q,
            "count": self.count,
            "m2": self._m2,
            "lag": self._lag,
            "last": self._last,
        }

    @classmethod
    def from_dict(cls, data: dict[str, float | int | None]) -> ScatterBand:
        last = data.get("last")
        return cls(
            memory=float(data["memory"] or 1000.0),
            log_q=float(data["log_q"] or 0.0),
            count=int(data["count"] or 0),
            _m2=float(data.get("m2") or 0.0),
            _lag=float(data.get("lag") or 0.0),
            _last=None if last is None else float(last),
        )
