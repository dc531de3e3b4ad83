"""The evolving planner: online models, statistically gated in-place switches.

Per tick (``decide``), in order; the first rule that applies wins:

1. Node pins: a node pinned to a phase it is not in is switched to it.
2. Split pin: move toward the pinned prefill count (pins beat every gate).
3. Not enough data (models before warm-up, too few requests, or less than
   ``min_history_s`` of traffic history): hold.
4. A switch in progress (some node draining) or the cooldown: hold.
5. SLO repair: fewer prefill nodes than the TTFT SLO needs (or more than the
   TPOT SLO allows), and that has held in every sub-window of the
   persistence span: move to the best split inside the SLO bounds.
6. Gain: the split inside the SLO bounds with the best lower-bounded net gain
   (capacity gain × horizon − switch cost) is chosen when that bound, as a
   fraction of current capacity × horizon, reaches ``min_gain_frac`` **and**
   the mean net gain reaches it in every sub-window of the persistence span
   (a burst of sub-agents lives in one sub-window, so it cannot pass).

Modes: AUTO returns the actions; ADVISORY and MANUAL return none, with the
would-be split in ``chosen_split`` and the would-be moves in ``reason``.
Predictions per split are computed on every tick once data suffices.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from core import Phase
from planner import decision as rule
from planner.engine_limits import with_engine_limits
from planner.estimator import (
    EstimatorConfig,
    SplitEstimate,
    estimate_many,
    estimate_splits,
    switch_costs,
    to_predictions,
)
from planner.offered import offered_weights
from planner.profile import Profile
from planner.regression import RLSConfig
from planner.types import (
    ClusterView,
    Decision,
    IterationRecord,
    PlannerMode,
    RequestSample,
    SplitPrediction,
    SwitchAction,
)
from planner.workload import WorkloadConfig, WorkloadEstimate, WorkloadEstimator


@dataclass(frozen=True)
class EvolvingConfig:
    """Settings of the evolving planner (validated at construction).

    horizon_s: seconds over which a switch's gain is amortised against its cost (> 0).
    min_gain_frac: required net gain, fraction of current capacity × horizon (≥ 0).
    persist_s: span over which a change must have held (> 0, ≤ workload retention).
    persist_buckets: sub-windows of that span that must each agree (≥ 1).
    min_bucket_requests: requests a sub-window needs to count as evidence (≥ 1).
    min_requests: requests in the main window before any model-based move (≥ 1).
    cooldown_s: seconds after a switch before the next model-based one (≥ 0).
    min_prefill / min_decode: node floors of each phase (≥ 0 / ≥ 1).
    max_nodes_per_decision: cap on nodes moved per tick; None = as predicted.
    slo_margin: SLO bounds use margin × target, for headroom ((0, 1]).
    min_history_s: traffic history (s) needed before any model-based move:
        a request is seen only when it finishes, so early on the long ones
        (reasoning decodes of minutes) are missing from the estimate (≥ 0).
    key_by_report: re-key each finished request's sample to the later of its
        arrival and the previous tick, i.e. to (within one tick) the time it
        finished. Keyed by arrival, a window holds only the requests that
        both arrived and finished in it, so every request longer than the
        window is missing and the mix is biased toward short requests
        (survivorship); keyed by finish, it holds the requests completed in
        it, an unbiased sample of the served mix.
    offered_mix: weight finished requests by how much longer their agent
        waited than on an unloaded node (``planner.offered``), so the mix is
        the one a closed loop of agents offers, not the one the current
        split serves; ``offered_max_weight`` caps a weight (≥ 1).
    latency_headroom: while the current split's capacity (lower bound)
        exceeds the request rate by this fraction, more capacity serves no
        more requests (open loop) or serves more only through shorter
        responses (a closed loop of N agents with tool time Z sends
        N / (Z + R)): the planner then moves on predicted mean response
        time instead of capacity (``_by_latency``). None: capacity only (≥ 0).
    workload / estimator / regression: the sub-components' configs. The
        workload window defaults to 60 s = persist_s, so that once a shift
        has persisted the estimate holds only post-shift traffic.
    """

    horizon_s: float = 600.0
    min_gain_frac: float = 0.05
    persist_s: float = 60.0
    persist_buckets: int = 4
    min_bucket_requests: int = 5
    min_requests: int = 20
    cooldown_s: float = 60.0
    min_prefill: int = 1
    min_decode: int = 1
    max_nodes_per_decision: int | None = None
    slo_margin: float = 0.8
    min_history_s: float = 120.0
    key_by_report: bool = True
    offered_mix: bool = True
    offered_max_weight: float = 10.0
    latency_headroom: float | None = 0.1
    workload: WorkloadConfig = field(default_factory=lambda: WorkloadConfig(window_s=60.0))
    estimator: EstimatorConfig = field(default_factory=EstimatorConfig)
    regression: RLSConfig = field(default_factory=RLSConfig)

    def __post_init__(self) -> None:
        if self.horizon_s <= 0 or self.persist_s <= 0 or self.min_gain_frac < 0 or self.cooldown_s < 0:
            raise ValueError("horizon_s, persist_s must be > 0; min_gain_frac, cooldown_s >= 0")
        if self.persist_s > self.workload.retention_s:
            raise ValueError("persist_s must not exceed workload.retention_s")
        if self.persist_buckets < 1 or self.min_bucket_requests < 1 or self.min_requests < 1:
            raise ValueError("persist_buckets, min_bucket_requests, min_requests must be >= 1")
        if self.min_prefill < 0 or self.min_decode < 1:
            raise ValueError("min_prefill must be >= 0 and min_decode >= 1")
        if self.latency_headroom is not None and self.latency_headroom < 0:
            raise ValueError("latency_headroom must be >= 0 or None")
        if self.max_nodes_per_decision is not None and self.max_nodes_per_decision < 1:
            raise ValueError("max_nodes_per_decision must be >= 1 or None")
        if self.min_history_s < 0:
            raise ValueError("min_history_s must be >= 0")
        if self.offered_max_weight < 1:
            raise ValueError("offered_max_weight must be >= 1")
        if not 0 < self.slo_margin <= 1:
            raise ValueError("slo_margin must be in (0, 1]")


@dataclass
class _Tick:
    """Working state of one ``decide`` call."""

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
    estimator: EstimatorConfig | None = None  # the config with the nodes' own engine limits


class EvolvingPlanner:
    """Planner Protocol implementation; ``switch_kind`` tells the simulator
    that its switches are in place (seconds, not a relaunch)."""

    name = "evolving"
    switch_kind = "inplace"

    def __init__(self, config: EvolvingConfig | None = None, profile: Profile | None = None) -> None:
        self.config = config or EvolvingConfig()
        self.profile = profile or Profile.from_records([], self.config.regression)
        self.workload = WorkloadEstimator(self.config.workload)
        self._last_act_t: float | None = None
        self._last_tick_t: float | None = None  # ``now`` of the previous decide
        self.last_decision: Decision | None = None

    def observe_iterations(self, records: list[IterationRecord]) -> None:
        self.profile.update(sorted(records, key=lambda r: r.t))

    def observe_requests(self, samples: list[RequestSample]) -> None:
        t0 = self._last_tick_t
        weights = (
            offered_weights(self.profile, samples, self.config.offered_max_weight) if self.config.offered_mix else None
        )
        self.workload.observe(samples, weights, not_before=t0 if self.config.key_by_report else None)

    # -- decide --------------------------------------------------------------
    def decide(self, view: ClusterView) -> Decision:
        cfg = self.config
        self._last_tick_t = view.now if self._last_tick_t is None else max(self._last_tick_t, view.now)
        nodes = view.nodes
        p_cur = sum(1 for n in nodes if n.phase == Phase.PREFILL)
        tick = _Tick(view, (p_cur, len(nodes) - p_cur), rule.protected_ids(nodes, view.pin), 0, 0, {})
        lo, hi = rule.reachable(nodes, p_cur, tick.protected)
        tick.lo = max(lo, min(cfg.min_prefill, p_cur))
        tick.hi = min(hi, max(len(nodes) - cfg.min_decode, p_cur))
        if cfg.max_nodes_per_decision is not None:
            tick.lo = max(tick.lo, p_cur - cfg.max_nodes_per_decision)
            tick.hi = min(tick.hi, p_cur + cfg.max_nodes_per_decision)
        self._estimate(tick)
        pin_moves = rule.node_pin_actions(nodes, view.pin)
        if pin_moves:
            return self._finish(tick, tuple(pin_moves), "node pin: " + ", ".join(a.node_id for a in pin_moves), 1.0)
        if view.pin and view.pin.prefill_nodes is not None:
            lo, hi = rule.reachable(nodes, p_cur, tick.protected)
            target = int(np.clip(view.pin.prefill_nodes, lo, hi))
            return self._move(tick, target, f"split pin: {view.pin.prefill_nodes} prefill nodes", 1.0)
        if tick.est is None:
            return self._finish(tick, (), "hold: insufficient data", 0.0)
        if any(n.draining for n in nodes):
            return self._finish(tick, (), "hold: switch in progress", 0.0)
        last = max((t for t in (view.last_switch_t, self._last_act_t) if t is not None), default=None)
        if last is not None and view.now - last < cfg.cooldown_s:
            tick.inputs["cooldown_left_s"] = cfg.cooldown_s - (view.now - last)
            return self._finish(tick, (), "hold: cooldown", 0.0)
        return self._by_model(tick)

    def _estimate(self, tick: _Tick) -> None:
        cfg, view = self.config, tick.view
        tick.inputs.update(self._model_inputs())
        n_nodes = len(view.nodes)
        w = self.workload.estimate(view.now)
        tick.inputs.update(w.summary())
        if not self.profile.ready or w.n < cfg.min_requests or n_nodes < 2:
            return
        if not self.workload.covers(view.now, cfg.min_history_s):
            return
        splits = self._splits(n_nodes, tick.current[0])
        tick.workload = w
        tick.kv_tokens = self._kv_tokens(view)
        tick.estimator = with_engine_limits(cfg.estimator, view.nodes)
        tick.est = estimate_splits(
            self.profile,
            w,
            n_nodes,
            splits,
            reference_prefill=tick.current[0],
            slo=view.slo,
            kv_capacity_tokens=tick.kv_tokens,
            config=tick.estimator,
        )
        tick.seconds, tick.lost = switch_costs(tick.est, tick.current[0], n_nodes, tick.estimator)

    def _splits(self, n_nodes: int, p_cur: int) -> np.ndarray:
        lo = min(self.config.min_prefill, p_cur)
        hi = max(n_nodes - self.config.min_decode, p_cur)
        return np.arange(lo, hi + 1)

    def _model_inputs(self) -> dict[str, float]:
        p, d = self.profile.prefill.rls, self.profile.decode.rls
        return {
            "prefill_samples": float(p.count),
            "decode_samples": float(d.count),
            "prefill_sigma_ms": p.sigma,
            "decode_sigma_ms": d.sigma,
        }

    @staticmethod
    def _kv_tokens(view: ClusterView) -> float:
        caps = [n.kv_capacity_tokens for n in view.nodes if n.kv_capacity_tokens > 0]
        return float(np.mean(caps)) if caps else 0.0

    def _by_model(self, tick: _Tick) -> Decision:
        cfg, view = self.config, tick.view
        est, lost, p_cur = tick.est, tick.lost, tick.current[0]
        assert est is not None and lost is not None
        net = rule.net_gain(est, lost, cfg.horizon_s, cfg.estimator.z)
        # Upper bounds here, means in the persisted check: moving down needs
        # confidence, repairing up needs a breach that held (hysteresis).
        floor, ceiling = rule.slo_bounds(est, view.slo, cfg.slo_margin, cfg.estimator.z)
        tick.inputs.update(ttft_floor_prefill=float(floor), tpot_ceiling_prefill=float(ceiling))
        p = est.prefill_nodes
        in_range = (p >= tick.lo) & (p <= tick.hi)
        allowed = in_range & (p >= floor) & (p <= ceiling)
        if p_cur < floor or p_cur > ceiling:
            p_floor, p_ceiling = self._persisted_bounds(tick)
            if p_cur < p_floor or p_cur > p_ceiling:
                repair = in_range & (p >= p_floor) & (p <= max(p_floor, p_ceiling))
                target = rule.best_split(est, net.lcb, repair, p_cur)
                if target is None:  # bounds outside what can move now: go as far as allowed
                    target = int(np.clip(p_floor if p_cur < p_floor else p_ceiling, tick.lo, tick.hi))
                why = "TTFT" if p_cur < p_floor else "TPOT"
                return self._move(tick, target, f"SLO repair ({why}): bounds [{floor}, {ceiling}]", 1.0)
            tick.inputs["slo_breach_not_persisted"] = 1.0  # fall through: the gain rule may still move
        if cfg.latency_headroom is not None:
            by_latency = self._by_latency(tick, allowed)
            if by_latency is not None:
                return by_latency
        target = rule.best_split(est, net.lcb, allowed | (p == p_cur), p_cur)
        i_cur = est.index(p_cur)
        cap_cur = float(est.capacity_rps[i_cur])
        if target is None or target == p_cur:
            alt = np.where(allowed & (p != p_cur), net.mean, -np.inf)
            j = int(np.argmax(alt))
            conf = 1.0 - rule.normal_confidence(float(net.mean[j]), float(net.sd[j])) if np.isfinite(alt[j]) else 1.0
            return self._finish(tick, (), "hold: current split is best", conf)
        i = est.index(target)
        frac_lcb = rule.gain_fraction(float(net.lcb[i]), cap_cur, cfg.horizon_s)
        conf = rule.normal_confidence(float(net.mean[i]), float(net.sd[i]))
        tick.inputs.update(
            candidate_prefill=float(target),
            net_gain_lcb_frac=frac_lcb,
            gain_rps=float(est.gain_rps[i]),
            switch_cost_requests=float(lost[i]),
        )
        if frac_lcb < cfg.min_gain_frac:
            return self._finish(tick, (), f"hold: gain of {target}P below threshold ({frac_lcb:.3f})", 1.0 - conf)
        worst = self._persisted_gain(tick, target, float(lost[i]))
        tick.inputs["persisted_gain_frac"] = worst
        if worst < cfg.min_gain_frac:
            return self._finish(tick, (), f"hold: gain of {target}P not persisted ({worst:.3f})", 1.0 - conf)
        return self._move(tick, target, f"gain: {frac_lcb:.3f} of capacity (lower bound)", conf)

    def _by_latency(self, tick: _Tick, allowed: np.ndarray) -> Decision | None:
        """None unless the current split has capacity headroom; then the
        split whose mean response time is lowest, if its upper bound is
        ``min_gain_frac`` below the current one's and that held in every
        persistence sub-window (only splits with the same headroom count)."""
        cfg, est, w = self.config, tick.est, tick.workload
        assert est is not None and w is not None and cfg.latency_headroom is not None
        z, p_cur = cfg.estimator.z, tick.current[0]
        need = w.rate_rps * (1.0 + cfg.latency_headroom)
        cap_lo = est.capacity_rps - z * est.capacity_sd_rps
        i_cur = est.index(p_cur)
        if not cap_lo[i_cur] >= need:
            return None
        e_cur = float(est.e2e_s[i_cur])
        roomy = allowed & est.feasible & (cap_lo >= need) & (est.prefill_nodes != p_cur)
        upper = np.where(roomy, est.e2e_s + z * est.e2e_sd_s, np.inf)
        j = int(np.argmin(upper))
        tick.inputs.update(headroom=float(cap_lo[i_cur] / max(w.rate_rps, 1e-9) - 1.0), e2e_current_s=e_cur)
        frac = 1.0 - float(upper[j]) / e_cur if np.isfinite(upper[j]) and e_cur > 0 else -np.inf
        if frac < cfg.min_gain_frac:
            return self._finish(tick, (), "hold: capacity has headroom and no split answers clearly faster", 1.0)
        target = int(est.prefill_nodes[j])
        conf = rule.normal_confidence(e_cur - float(est.e2e_s[j]), float(est.e2e_sd_s[j]))
        tick.inputs.update(candidate_prefill=float(target), e2e_gain_frac_ucb=frac)
        buckets = self._bucket_estimates(tick)
        ests = self._quick(buckets, np.array([p_cur, target]), tick) if buckets else []
        worst = min((1.0 - float(e.e2e_s[1]) / float(e.e2e_s[0]) for e in ests), default=-np.inf)
        tick.inputs["persisted_e2e_gain_frac"] = worst
        if worst < cfg.min_gain_frac:
            return self._finish(
                tick, (), f"hold: faster responses at {target}P not persisted ({worst:.3f})", 1.0 - conf
            )
        return self._move(
            tick, target, f"latency: mean response {frac:.3f} shorter at {target}P (bound), capacity has headroom", conf
        )

    def _bucket_estimates(self, tick: _Tick) -> list[WorkloadEstimate] | None:
        cfg = self.config
        if not self.workload.covers(tick.view.now, cfg.persist_s):
            return None
        buckets = self.workload.bucket_estimates(tick.view.now, cfg.persist_s, cfg.persist_buckets)
        return buckets if all(b.n >= cfg.min_bucket_requests for b in buckets) else None

    def _persisted_bounds(self, tick: _Tick) -> tuple[int, int]:
        """SLO bounds that held in every sub-window (floor: the lowest one)."""
        buckets = self._bucket_estimates(tick)
        if buckets is None:
            return tick.current[0], tick.current[0]
        n_nodes, p_cur = len(tick.view.nodes), tick.current[0]
        ests = self._quick(buckets, self._splits(n_nodes, p_cur), tick)
        bounds = [rule.slo_bounds(e, tick.view.slo, self.config.slo_margin) for e in ests]
        return min(b[0] for b in bounds), max(b[1] for b in bounds)

    def _persisted_gain(self, tick: _Tick, target: int, lost: float) -> float:
        """Smallest mean net-gain fraction of ``target`` across sub-windows."""
        buckets = self._bucket_estimates(tick)
        if buckets is None:
            return -np.inf
        horizon = self.config.horizon_s
        ests = self._quick(buckets, np.array([tick.current[0], target]), tick)
        return float(
            min(
                rule.gain_fraction(float(e.gain_rps[1]) * horizon - lost, float(e.capacity_rps[0]), horizon)
                for e in ests
            )
        )

    def _quick(self, ws: list[WorkloadEstimate], splits: np.ndarray, tick: _Tick) -> list[SplitEstimate]:
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

    # -- output --------------------------------------------------------------
    def _move(self, tick: _Tick, target: int, why: str, confidence: float) -> Decision:
        actions = rule.move_actions(tick.view.nodes, tick.current[0], target, tick.protected)
        if not actions:
            return self._finish(tick, (), f"hold: {why}; already there or nothing movable", confidence)
        return self._finish(tick, actions, why, confidence)

    def _finish(self, tick: _Tick, actions: tuple[SwitchAction, ...], reason: str, confidence: float) -> Decision:
        view = tick.view
        chosen = rule.split_after(tick.current, actions, view.nodes)
        acted = view.mode == PlannerMode.AUTO and bool(actions)
        if actions and not acted:
            moves = ", ".join(f"{a.node_id}->{a.to_phase.value}" for a in actions)
            reason = f"{view.mode.value}: would {reason} [{moves}]"
        if acted:
            self._last_act_t = view.now
        preds: tuple[SplitPrediction, ...] = ()
        if tick.est is not None and tick.seconds is not None:
            preds = to_predictions(tick.est, tick.seconds, self.config.estimator.z)
        self.last_decision = Decision(
            t=view.now,
            planner=self.name,
            current_split=tick.current,
            chosen_split=chosen,
            actions=actions if acted else (),
            acted=acted,
            reason=reason,
            confidence=float(min(max(confidence, 0.0), 1.0)),
            predictions=preds,
            inputs={k: float(np.clip(v, -1e18, 1e18)) for k, v in tick.inputs.items()},  # JSON-safe
        )
        return self.last_decision
