"""Workload estimate over a sliding time window of finished requests.

Samples are folded into fixed time bins of sufficient statistics (count, sum
and sum of squares of uncached, cached and output tokens), kept separately
for *local* requests (uncached ≤ the router's local-prefill threshold: the
whole request runs on a decode node) and *remote* ones (prefill node, then
decode node). Any window or sub-window is then a sum over bins: the cost of
an estimate does not grow with the request rate.

Samples are keyed by arrival time but reported when they finish, so the
newest bins are incomplete; ``lag_s`` shifts every window back by that much.

A sample may carry a weight (default 1): token means and the local fraction
are weighted, the request count and rate are not. The planner weights
closed-loop samples so that the mix is the one agents would offer, not the
one the current split happens to serve (``EvolvingConfig.offered_mix``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from planner.types import RequestSample

# Column layout of one bin's statistics, per class (0 = remote, 1 = local):
# request count, weight sum, weighted sums of tokens and squared tokens.
_N, _W, _U, _U2, _C, _C2, _O, _O2 = range(8)
_COLUMNS = 8
REMOTE, LOCAL = 0, 1


@dataclass(frozen=True)
class WorkloadConfig:
    """window_s: default estimate window, s (> 0).
    bin_s: time resolution, s (> 0, ≤ window_s).
    retention_s: history kept, s (≥ window_s); must cover persistence spans.
    local_prefill_max_tokens: the router's threshold (≥ 0): requests with at
        most this many uncached tokens run entirely on a decode node.
    lag_s: windows end at ``now − lag_s`` (≥ 0), for requests still running.
    """

    window_s: float = 120.0
    bin_s: float = 1.0
    retention_s: float = 600.0
    local_prefill_max_tokens: int = 256
    lag_s: float = 0.0

    def __post_init__(self) -> None:
        if self.window_s <= 0 or self.bin_s <= 0 or self.bin_s > self.window_s:
            raise ValueError("need 0 < bin_s <= window_s")
        if self.retention_s < self.window_s:
            raise ValueError("retention_s must be >= window_s")
        if self.local_prefill_max_tokens < 0 or self.lag_s < 0:
            raise ValueError("local_prefill_max_tokens and lag_s must be >= 0")


@dataclass(frozen=True)
class WorkloadEstimate:
    """Traffic over one window. Token figures are per request; std is the
    spread across requests (not the standard error of the mean)."""

    window_s: float
    n: int
    rate_rps: float
    uncached_mean: float
    uncached_std: float
    cached_mean: float
    cached_std: float
    output_mean: float
    output_std: float
    local_fraction: float  # of requests, in [0, 1]
    n_remote: int
    remote_uncached_mean: float
    remote_uncached_std: float
    remote_cached_mean: float
    remote_cached_std: float
    local_uncached_mean: float
    local_cached_mean: float
    # Σ weights / window: the rate agents would offer if nothing queued
    # (planner.offered); equals rate_rps when no sample is reweighted.
    offered_rate_rps: float = 0.0

    def summary(self) -> dict[str, float]:
        """Flat numbers for a Decision's ``inputs``."""
        return {
            "rate_rps": self.rate_rps,
            "offered_rate_rps": self.offered_rate_rps,
            "requests": float(self.n),
            "uncached_mean": self.uncached_mean,
            "cached_mean": self.cached_mean,
            "output_mean": self.output_mean,
            "local_fraction": self.local_fraction,
        }


def _moments(row: np.ndarray, col: int) -> tuple[float, float]:
    """Weighted mean and spread of column ``col`` (its square at ``col + 1``)."""
    n, w, s, s2 = float(row[_N]), float(row[_W]), float(row[col]), float(row[col + 1])
    if n <= 0 or w <= 0:
        return 0.0, 0.0
    mean = s / w
    var = max(s2 / w - mean * mean, 0.0) * (n / (n - 1) if n > 1 else 1.0)
    return mean, math.sqrt(var)


def estimate_from_stats(stats: np.ndarray, window_s: float) -> WorkloadEstimate:
    """Build an estimate from summed bin statistics (shape 2 × 8)."""
    total = stats[REMOTE] + stats[LOCAL]
    n = float(total[_N])
    u, u_sd = _moments(total, _U)
    c, c_sd = _moments(total, _C)
    o, o_sd = _moments(total, _O)
    r = stats[REMOTE]
    ru, ru_sd = _moments(r, _U)
    rc, rc_sd = _moments(r, _C)
    loc = stats[LOCAL]
    lu, _ = _moments(loc, _U)
    lc, _ = _moments(loc, _C)
    return WorkloadEstimate(
        window_s=window_s,
        n=int(n),
        rate_rps=n / window_s,
        uncached_mean=u,
        uncached_std=u_sd,
        cached_mean=c,
        cached_std=c_sd,
        output_mean=o,
        output_std=o_sd,
        local_fraction=float(loc[_W] / total[_W]) if n > 0 and total[_W] > 0 else 0.0,
        n_remote=int(r[_N]),
        remote_uncached_mean=ru,
        remote_uncached_std=ru_sd,
        remote_cached_mean=rc,
        remote_cached_std=rc_sd,
        local_uncached_mean=lu,
        local_cached_mean=lc,
        offered_rate_rps=float(total[_W]) / window_s,
    )


class WorkloadEstimator:
    """Binned sliding-window traffic statistics (see module doc)."""

    def __init__(self, config: WorkloadConfig = WorkloadConfig()) -> None:
        self.config = config
        self._slots = int(math.ceil(config.retention_s / config.bin_s)) + 2
        self._ids = np.full(self._slots, -(2**62), dtype=np.int64)
        self._stats = np.zeros((self._slots, 2, _COLUMNS))
        self.first_t: float | None = None  # earliest arrival seen

    def observe(
        self,
        samples: Iterable[RequestSample],
        weights: Iterable[float] | None = None,
        *,
        not_before: float | None = None,
    ) -> None:
        """Fold finished requests in (``weights``: one per sample, > 0, default
        1); samples older than retention are dropped. ``not_before``: a sample
        that arrived earlier is binned at this time instead."""
        rows = [(s.t, s.uncached_prompt_tokens, s.cached_prompt_tokens, s.output_tokens) for s in samples]
        if not rows:
            return
        arr = np.asarray(rows, dtype=float)
        t, u, c, o = arr.T
        if not_before is not None:
            t = np.maximum(t, not_before)
        w = np.ones(len(rows)) if weights is None else np.asarray(list(weights), dtype=float)
        if w.shape != t.shape or not (w > 0).all():
            raise ValueError("need one weight > 0 per sample")
        bins = np.floor(t / self.config.bin_s).astype(np.int64)
        slots = bins % self._slots
        for b in np.unique(bins):  # claim slots for bins newer than what they hold
            slot = int(b % self._slots)
            if self._ids[slot] < b:
                self._ids[slot] = b
                self._stats[slot] = 0.0
        keep = self._ids[slots] == bins
        if not keep.any():
            return
        cls = np.where(u[keep] <= self.config.local_prefill_max_tokens, LOCAL, REMOTE)
        uk, ck, ok, wk = u[keep], c[keep], o[keep], w[keep]
        vals = np.stack(
            [np.ones_like(uk), wk, wk * uk, wk * uk * uk, wk * ck, wk * ck * ck, wk * ok, wk * ok * ok], axis=-1
        )
        np.add.at(self._stats, (slots[keep], cls), vals)
        t_min = float(t[keep].min())
        self.first_t = t_min if self.first_t is None else min(self.first_t, t_min)

    def _sum(self, start: float, end: float) -> np.ndarray:
        b0 = math.floor(start / self.config.bin_s)
        b1 = math.floor(end / self.config.bin_s)
        mask = (self._ids >= b0) & (self._ids < b1)
        return self._stats[mask].sum(axis=0)

    def estimate(self, now: float, window_s: float | None = None) -> WorkloadEstimate:
        """Estimate over ``[now − lag − window, now − lag)``."""
        w = self.config.window_s if window_s is None else window_s
        end = now - self.config.lag_s
        return estimate_from_stats(self._sum(end - w, end), w)

    def bucket_estimates(self, now: float, span_s: float, buckets: int) -> list[WorkloadEstimate]:
        """Estimates of ``buckets`` equal, consecutive sub-windows covering the
        last ``span_s`` seconds (oldest first)."""
        if buckets < 1 or span_s <= 0:
            raise ValueError("need buckets >= 1 and span_s > 0")
        end = now - self.config.lag_s
        width = span_s / buckets
        starts = [end - span_s + i * width for i in range(buckets)]
        return [estimate_from_stats(self._sum(s, s + width), width) for s in starts]

    def covers(self, now: float, span_s: float) -> bool:
        """True when observations reach back at least ``span_s`` before the
        window end (a persistence check over a shorter history is void)."""
        return self.first_t is not None and self.first_t <= now - self.config.lag_s - span_s

    def persisted_change(
        self,
        now: float,
        reference: WorkloadEstimate,
        span_s: float,
        buckets: int = 4,
        rel_tol: float = 0.2,
        min_samples: int = 5,
    ) -> bool:
        """Has the workload differed from ``reference`` in the same direction in
        every one of ``buckets`` sub-windows of the last ``span_s`` seconds?

        Compared, each relative to the reference: arrival rate, mean uncached,
        cached and output tokens, and the local fraction (absolute, vs
        ``rel_tol``). A burst confined to one sub-window is not persisted.
        Token statistics count only in sub-windows with ``min_samples``.
        """
        if not self.covers(now, span_s):
            return False
        ests = self.bucket_estimates(now, span_s, buckets)

        def direction(value: float, ref: float, absolute: bool = False) -> int:
            scale = 1.0 if absolute else max(abs(ref), 1e-9)
            delta = (value - ref) / scale
            return 0 if abs(delta) <= rel_tol else (1 if delta > 0 else -1)

        def same_sign(dirs: list[int]) -> bool:
            return bool(dirs) and dirs[0] != 0 and all(d == dirs[0] for d in dirs)

        if same_sign([direction(e.rate_rps, reference.rate_rps) for e in ests]):
            return True
        if any(e.n < min_samples for e in ests):
            return False
        checks = [
            [direction(e.uncached_mean, reference.uncached_mean) for e in ests],
            [direction(e.cached_mean, reference.cached_mean) for e in ests],
            [direction(e.output_mean, reference.output_mean) for e in ests],
            [direction(e.local_fraction, reference.local_fraction, absolute=True) for e in ests],
        ]
        return any(same_sign(d) for d in checks)
