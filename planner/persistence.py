"""The persistence check of the evolving planner (``planner.evolving``).

A gain or an SLO breach counts only where it holds, on means, in every
sub-window of the persistence span (``EvolvingConfig.persist_s`` cut into
``persist_buckets``): a burst of sub-agents lives in one sub-window, so
it cannot pass, while a shift in the mix shows in all of them. Each
sub-window is estimated like the whole window: its own offered load
(counted at arrival where the view carries the counts) and, while a
phase is saturated, the same work correction as the tick's
(``planner.saturation``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from core import Phase
from planner import decision as rule
from planner import objective
from planner.arrivals import ArrivalHistory
from planner.estimator import EstimatorConfig, SplitEstimate, estimate_many
from planner.evolving_config import EvolvingConfig
from planner.profile import Profile
from planner.saturation import scaled
from planner.types import ClusterView
from planner.workload import WorkloadEstimate, WorkloadEstimator


@dataclass
class Tick:
    """Working state of one ``EvolvingPlanner.decide`` call."""

    view: ClusterView
    current: tuple[int, int]
    protected: set[str]
    lo: int  # reachable / allowed prefill range
    hi: int
    inputs: dict[str, float]
    est: SplitEstimate | None = None
    workload: WorkloadEstimate | None = None
    lost: np.ndarray | None = None  # switch cost per split, requests
    seconds: np.ndarray | None = None  # switch cost per split, node-seconds
    kv_tokens: float = 0.0
    early: bool = False  # less than min_history_s of traffic: only an early move (config) may act
    estimator: EstimatorConfig | None = None  # the config with the nodes' own engine limits
    corrected: tuple[Phase, float] | None = None  # saturated phase and its work factor (planner.saturation)


def candidate_splits(config: EvolvingConfig, n_nodes: int, p_cur: int) -> np.ndarray:
    """Prefill counts the planner estimates: the configured minimums, widened to the current split."""
    lo = min(config.min_prefill, p_cur)
    hi = max(n_nodes - config.min_decode, p_cur)
    return np.arange(lo, hi + 1)


@dataclass(frozen=True)
class Persistence:
    """The planner's models, read per sub-window of the persistence span."""

    config: EvolvingConfig
    profile: Profile
    workload: WorkloadEstimator
    arrivals: ArrivalHistory

    def offered(self, w: WorkloadEstimate, start: float, end: float) -> WorkloadEstimate:
        """``w`` with the offered rate counted at arrival over [start, end], where counted."""
        rate = self.arrivals.rate(start, end)
        return w if rate is None else replace(w, offered_rps=rate)

    def estimates(self, tick: Tick, ws: list[WorkloadEstimate], splits: np.ndarray) -> list[SplitEstimate]:
        """One split estimate per workload, at the tick's nodes, SLO and engine limits."""
        return estimate_many(
            self.profile,
            ws,
            len(tick.view.nodes),
            splits,
            reference_prefill=tick.current[0],
            slo=tick.view.slo,
            kv_capacity_tokens=tick.kv_tokens,
            config=tick.estimator or self.config.estimator,
        )

    def sub_windows(self, tick: Tick) -> list[WorkloadEstimate] | None:
        """The workload of each sub-window; None while the history is short or a sub-window too thin."""
        cfg, now = self.config, tick.view.now
        if not self.workload.covers(now, cfg.persist_s):
            return None
        buckets = self.workload.bucket_estimates(now, cfg.persist_s, cfg.persist_buckets)
        if not all(b.n >= cfg.min_bucket_requests for b in buckets):
            return None
        end, width = now - cfg.workload.lag_s, cfg.persist_s / cfg.persist_buckets
        starts = [end - cfg.persist_s + k * width for k in range(cfg.persist_buckets)]
        out = [self.offered(b, s, s + width) for b, s in zip(buckets, starts, strict=True)]
        if tick.corrected is not None:
            out = [scaled(b, *tick.corrected) for b in out]
        return out

    def bounds(self, tick: Tick) -> tuple[int, int]:
        """SLO bounds that held in every sub-window (floor: the lowest one)."""
        buckets = self.sub_windows(tick)
        if buckets is None:
            return tick.current[0], tick.current[0]
        splits = candidate_splits(self.config, len(tick.view.nodes), tick.current[0])
        ests = self.estimates(tick, buckets, splits)
        bounds = [rule.slo_bounds(e, tick.view.slo, self.config.slo_margin) for e in ests]
        return min(b[0] for b in bounds), max(b[1] for b in bounds)

    def worst_gain(self, tick: Tick, target: int, lost: float, kind: str) -> float:
        """Smallest gain fraction of ``target`` (on means) across sub-windows;
        a latency gain counts only where the throughput stays within tie_frac."""
        buckets = self.sub_windows(tick)
        if buckets is None:
            return -np.inf
        p_cur = tick.current[0]
        worst = np.inf
        for e in self.estimates(tick, buckets, np.array([p_cur, target])):
            thr, lat = objective.mean_gains(e, target, p_cur, lost, self.config.horizon_s)
            if kind == "latency" and e.served_rps[1] < (1.0 - self.config.tie_frac) * e.served_rps[0]:
                lat = -np.inf
            worst = min(worst, thr if kind == "throughput" else lat)
        return float(worst)
