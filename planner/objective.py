"""The evolving planner's one objective: serve the offered load, then answer it fast.

Every split gets the throughput it would serve of the offered load, X(P),
and its mean response time there, R(P) (``SplitEstimate.served_rps`` /
``response_s``). A split T is worth moving to from the current split C when

- **throughput**: the lower bound of the net gain (X(T) − X(C))·H − switch
  cost, minus z standard deviations, is at least ``g``·X(C)·H; or
- **latency**: X(T) ≥ (1 − t)·X(C) and the upper bound of R(T) is at most
  (1 − g)·R(C),

with g = ``min_gain_frac`` and t = ``tie_frac`` < g/(1 + g). Both sides are
functions of the splits alone, never of which split is current, and a move
of either kind cannot be followed by its undoing on the same estimates: a
throughput move raises X by more than the (1 − t) a latency move may give
back, and two latency moves cannot both shorten R. (The old rules, capacity
gain below 10 % headroom and response time above it, switched objective
with the current split and could chase each other: 3P -> 4P for capacity,
4P -> 3P for latency.) The throughput candidate is the split with the most
X (ties: shortest R, then nearest); the latency candidate the one with the
shortest R among those that keep X within t of the current split's. The
SLO bounds (TTFT floor, TPOT ceiling) choose among splits that serve alike:
a split that serves clearly more is taken even if it misses them (in
overload no split meets them: more prefill nodes only move the queue to
decode), and an SLO repair may not cost more than t of throughput.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np

from planner.estimator import SplitEstimate


def _nearest(est: SplitEstimate, idx: np.ndarray, current: int) -> int:
    return int(est.prefill_nodes[idx[np.argmin(np.abs(est.prefill_nodes[idx] - current))]])


def _prefer(est: SplitEstimate, cand: np.ndarray, prefer: np.ndarray | None, current: int) -> int | None:
    """Among `cand`: those in `prefer` (the SLO bounds) when any is, then the
    shortest response, then the nearest to `current`."""
    if not cand.any():
        return None
    if prefer is not None and (cand & prefer).any():
        cand = cand & prefer
    idx = np.flatnonzero(cand)
    r = est.response_s[idx]
    idx = idx[r <= r.min() + 1e-9 * max(abs(r.min()), 1.0)]
    return _nearest(est, idx, current)


def throughput_target(
    est: SplitEstimate, allowed: np.ndarray, current: int, tie_frac: float = 0.0, prefer: np.ndarray | None = None
) -> int | None:
    """Allowed split serving the most (within `tie_frac` of the most: ties go to
    splits in `prefer`, then the shortest response, then the nearest)."""
    if not allowed.any():
        return None
    top = float(est.served_rps[allowed].max())
    cand = allowed & (est.served_rps >= top * (1.0 - tie_frac) - 1e-9 * max(abs(top), 1.0))
    return _prefer(est, cand, prefer, current)


def latency_target(
    est: SplitEstimate, allowed: np.ndarray, current: int, tie_frac: float, prefer: np.ndarray | None = None
) -> int | None:
    """Allowed split with the shortest response among those serving at least
    (1 − tie_frac) of the current split's throughput (in `prefer` when any
    is; ties: nearest)."""
    x_cur = float(est.served_rps[est.index(current)])
    return _prefer(est, allowed & (est.served_rps >= (1.0 - tie_frac) * x_cur), prefer, current)


def throughput_gain(est: SplitEstimate, target: int, current: int, lost: float, horizon_s: float, z: float) -> float:
    """Net throughput gain of `target` over `current` as a fraction of what
    `current` serves over the horizon, at the lower confidence bound."""
    i, c = est.index(target), est.index(current)
    x_cur = float(est.served_rps[c])
    net = (float(est.served_rps[i]) - x_cur) * horizon_s - lost
    lcb = net - z * float(est.served_gain_sd_rps[i]) * horizon_s
    base = x_cur * horizon_s
    if base <= 0 or not math.isfinite(base):
        return math.inf if lcb > 0 else 0.0
    return lcb / base


def latency_gain(est: SplitEstimate, target: int, current: int, z: float) -> float:
    """1 − R(target)'s upper bound / R(current): how much shorter responses get."""
    i, c = est.index(target), est.index(current)
    r_cur = float(est.response_s[c])
    upper = float(est.response_s[i]) + z * float(est.response_sd_s[i])
    if not r_cur > 0 or not math.isfinite(upper):
        return -math.inf
    return 1.0 - upper / r_cur


def mean_gains(est: SplitEstimate, target: int, current: int, lost: float, horizon_s: float) -> tuple[float, float]:
    """(throughput, latency) gain fractions on means, no bounds (persistence sub-windows)."""
    i, c = est.index(target), est.index(current)
    x_cur, r_cur = float(est.served_rps[c]), float(est.response_s[c])
    thr = ((float(est.served_rps[i]) - x_cur) * horizon_s - lost) / (x_cur * horizon_s) if x_cur > 0 else -math.inf
    lat = 1.0 - float(est.response_s[i]) / r_cur if r_cur > 0 else -math.inf
    return thr, lat


def predicted_gain(
    est: SplitEstimate, target: int, current: int, kind: Literal["throughput", "latency"]
) -> tuple[float, float] | None:
    """(gain fraction, its sd) the model predicts for a move to `target`, on
    means and without the switch cost: what the move's check measures once
    the switch is done (throughput: X(T)/X(C) − 1; latency: 1 − R(T)/R(C));
    None when the current split's figure is no base (zero, infinite)."""
    i, c = est.index(target), est.index(current)
    if kind == "throughput":
        x_cur = float(est.served_rps[c])
        if x_cur <= 0:
            return None
        return float(est.served_rps[i]) / x_cur - 1.0, float(est.served_gain_sd_rps[i]) / x_cur
    r_cur = float(est.response_s[c])
    if r_cur <= 0 or not np.isfinite(r_cur):
        return None
    return 1.0 - float(est.response_s[i]) / r_cur, float(est.response_sd_s[i]) / r_cur
