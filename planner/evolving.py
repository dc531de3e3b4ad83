"""The evolving planner: online models, statistically gated in-place switches.

Per tick (``decide``), in order; the first rule that applies wins:

1. Node pins: a node pinned to a phase it is not in is switched to it.
2. Split pin: move toward the pinned prefill count (pins beat every gate),
   counting the nodes after rule 1's switches; both in one decision, by
   ``planner.decision.pin_actions``, the rule the gateway enforces pins by.
3. Not enough data (models before warm-up, too few requests, or less than
   ``min_history_s`` of traffic history): hold.
4. A switch in progress (some node draining) or the cooldown: hold.
5. SLO repair: fewer prefill nodes than the TTFT SLO needs (or more than the
   TPOT SLO allows), and that has held in every sub-window of the
   persistence span: move to the best split inside the SLO bounds; not
   for TTFT while the TTFT measured over that span meets the bound
   (``planner.ttft``).
6. The objective (``planner.objective``): within the SLO bounds, the split
   that serves the offered load best, by throughput (net of the switch
   cost, lower bound), else by response time at no throughput cost; the
   gain must clear ``min_gain_frac`` and hold, on means, in every sub-window
   of the persistence span (``planner.persistence``). A latency move gives a node of one phase to the
   other, so it needs the giving phase to have headroom: while its nodes
   kept ``throughput_queue`` requests waiting each over the span, they
   have none, whatever the model says (the queue is measured; the model's
   response time is not, and a queue it misses is the error that makes
   the move look good).

Every model-based move (5 and 6) is refused when it goes back to the split
the last one left, within ``flap_window_s`` of it. Every model-based move
is then checked once it has settled (``planner.verification``): until its
verdict no other model move is made; one that did not deliver is reverted
(before any rule above but the pins; an SLO repair only when it lost
more throughput than the tie band it was allowed, never a latency move
that raised the finish rate), and its miss is counted against later
gains of its kind, so staying put wins unless a move clears its bound
net of the switch cost and the verified error; an SLO repair, too, must
cost no more than the tie band net of the verified throughput error. The
split stood on is checked as well: where the model's mean response there
misses the measured one, the miss counts against later latency gains the
same way (``MoveVerifier.standing``). The offered load is
counted at arrival when the view carries the counts (``planner.arrivals``).
While one phase's queues show it saturated, its modelled capacity at the
current split is corrected to the rate requests actually finish at
(``planner.saturation``) before any rule reads the predictions.

Modes: AUTO returns the actions; ADVISORY and MANUAL return none, with the
would-be split in ``chosen_split`` and the would-be moves in ``reason``.
Predictions per split are computed on every tick once data suffices.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from core import Phase
from planner import decision as rule
from planner import objective
from planner.arrivals import ArrivalHistory
from planner.engine_limits import with_engine_limits
from planner.estimator import UNSTABLE_S, estimate_splits, switch_costs, to_predictions
from planner.evolving_config import EvolvingConfig
from planner.offered import offered_weights
from planner.persistence import Persistence, Tick, candidate_splits
from planner.profile import Profile
from planner.saturation import QueueHistory, correction, scaled, waiting_by_phase
from planner.ttft import TtftHistory
from planner.types import (
    ClusterView,
    Decision,
    IterationRecord,
    PlannerMode,
    RequestSample,
    SplitPrediction,
    SwitchAction,
)
from planner.verification import Kind, MoveVerifier, TickCounts, Verdict
from planner.workload import WorkloadEstimate, WorkloadEstimator

__all__ = ["EvolvingConfig", "EvolvingPlanner"]


class EvolvingPlanner:
    """Planner Protocol implementation; ``switch_kind`` tells the simulator
    that its switches are in place (seconds, not a relaunch)."""

    name = "evolving"
    switch_kind = "inplace"

    def __init__(self, config: EvolvingConfig | None = None, profile: Profile | None = None) -> None:
        self.config = config or EvolvingConfig()
        self.profile = profile or Profile.from_records([], self.config.regression)
        self.workload = WorkloadEstimator(self.config.workload)
        self.arrivals = ArrivalHistory(self.config.workload.retention_s)
        self.queues = QueueHistory(self.config.workload.retention_s)
        self.ttfts = TtftHistory(self.config.workload.retention_s)
        self.persistence = Persistence(self.config, self.profile, self.workload, self.arrivals)
        self._last_act_t: float | None = None
        self._last_tick_t: float | None = None  # ``now`` of the previous decide
        self._last_move: tuple[float, int, int] | None = None  # (t, from, to prefill nodes) of the last model move
        self._latency_run: tuple[int, int, float] | None = None  # (from, to, since) of a clearing latency bound
        self.last_decision: Decision | None = None
        v = self.config.verify
        retention = self.config.workload.retention_s
        if v is not None:
            v = v.resolved(self.config.persist_s, self.config.horizon_s)
        self.verifier = None if v is None else MoveVerifier(v, self.config.estimator.z, retention)
        self._finished = [0, 0.0, 0.0, 0]  # since the last tick: count, Σe2e, Σe2e², with e2e

    def observe_iterations(self, records: list[IterationRecord]) -> None:
        self.profile.update(sorted(records, key=lambda r: r.t))

    def observe_requests(self, samples: list[RequestSample]) -> None:
        t0 = self._last_tick_t
        e2e = [s.e2e_s for s in samples if s.e2e_s is not None]
        f = self._finished
        f[0] += len(samples)
        f[1] += float(sum(e2e))
        f[2] += float(sum(x * x for x in e2e))
        f[3] += len(e2e)
        weights = (
            offered_weights(self.profile, samples, self.config.offered_max_weight) if self.config.offered_mix else None
        )
        self.workload.observe(samples, weights, not_before=t0 if self.config.key_by_report else None)
        self.ttfts.add(t0 if t0 is not None else 0.0, [s.ttft_s for s in samples if s.ttft_s is not None])

    # -- decide --------------------------------------------------------------
    def decide(self, view: ClusterView) -> Decision:
        cfg = self.config
        self._observe(view)
        nodes = view.nodes
        tick = self._new_tick(view)
        p_cur = tick.current[0]
        self._estimate(tick)
        pinned = self._pinned(tick)
        if pinned is not None:
            return pinned
        verdict = None
        if self.verifier is not None:
            verdict = self.verifier.check(view.now, any(n.draining for n in nodes), p_cur)
            if verdict is not None:
                tick.inputs.update(verdict.inputs())
                if verdict.revert:
                    return self._revert(tick, verdict)
        if tick.est is None:
            return self._finish(tick, (), "hold: insufficient data", 0.0)
        if any(n.draining for n in nodes):
            return self._finish(tick, (), "hold: switch in progress", 0.0)
        last = max((t for t in (view.last_switch_t, self._last_act_t) if t is not None), default=None)
        if last is not None and view.now - last < cfg.cooldown_s:
            tick.inputs["cooldown_left_s"] = cfg.cooldown_s - (view.now - last)
            return self._finish(tick, (), "hold: cooldown", 0.0)
        if self.verifier is not None and self.verifier.pending is not None:
            m = self.verifier.pending
            why = f"hold: checking the move at t={m.t:g} ({m.from_prefill}P -> {m.to_prefill}P)"
            return self._finish(tick, (), why, 0.0)
        return self._by_model(tick)

    def _observe(self, view: ClusterView) -> None:
        """Feed the tick's arrivals, queues and finished counts to the estimators and the verifier."""
        self._last_tick_t = view.now if self._last_tick_t is None else max(self._last_tick_t, view.now)
        if view.requests_arrived is not None:
            self.arrivals.add(view.now, view.requests_arrived + (view.requests_rejected or 0))
        waiting = waiting_by_phase(view.nodes)
        self.queues.add(view.now, *waiting)
        if self.verifier is not None:
            f = self._finished
            self.verifier.add(TickCounts(view.now, int(f[0]), f[1], f[2], int(f[3]), waiting[0][0] + waiting[1][0]))
        self._finished = [0, 0.0, 0.0, 0]

    def _new_tick(self, view: ClusterView) -> Tick:
        """The tick's current split and the prefill counts it may move to (pins, minimums, step limit)."""
        cfg, nodes = self.config, view.nodes
        p_cur = sum(1 for n in nodes if n.phase == Phase.PREFILL)
        tick = Tick(view, (p_cur, len(nodes) - p_cur), rule.protected_ids(nodes, view.pin), 0, 0, {})
        lo, hi = rule.reachable(nodes, p_cur, tick.protected)
        tick.lo = max(lo, min(cfg.min_prefill, p_cur))
        tick.hi = min(hi, max(len(nodes) - cfg.min_decode, p_cur))
        if cfg.max_nodes_per_decision is not None:
            tick.lo = max(tick.lo, p_cur - cfg.max_nodes_per_decision)
            tick.hi = min(tick.hi, p_cur + cfg.max_nodes_per_decision)
        return tick

    def _revert(self, tick: Tick, verdict: Verdict) -> Decision:
        """Back to the split a move left when it did not deliver
        (``planner.verification``); the failed split is then refused for
        ``flap_window_s`` like any move back."""
        m = verdict.move
        why = (
            f"revert: {m.from_prefill}P -> {m.to_prefill}P at t={m.t:g} predicted {m.predicted:+.3f}, "
            f"realized {verdict.realized:+.3f} (sd {verdict.measured_sd:.3f})"
        )
        decision = self._move(tick, m.from_prefill, why, 1.0)
        if decision.acted:
            self._last_move = (tick.view.now, tick.current[0], decision.chosen_split[0])
        return decision

    def _estimate(self, tick: Tick) -> None:
        cfg, view = self.config, tick.view
        tick.inputs.update(self._model_inputs())
        n_nodes = len(view.nodes)
        end = view.now - cfg.workload.lag_s
        w = self.persistence.offered(self.workload.estimate(view.now), end - cfg.workload.window_s, end)
        tick.inputs.update(w.summary())
        if not self.profile.ready or w.n < cfg.min_requests or n_nodes < 2:
            return
        if not self.workload.covers(view.now, cfg.min_history_s):
            if cfg.early_s is None or not self.workload.covers(view.now, cfg.early_s):
                return
            tick.early = True
        splits = candidate_splits(self.config, n_nodes, tick.current[0])
        tick.workload = w
        tick.kv_tokens = self._kv_tokens(view)
        tick.estimator = with_engine_limits(cfg.estimator, view.nodes)
        budget = tick.estimator.prefill_token_budget
        if self.workload.config.chunk_tokens != budget:
            # Attention pairs are counted as the nodes' engine chunks (their reported budget);
            # samples already binned keep the count they were binned with.
            self.workload.config = replace(self.workload.config, chunk_tokens=budget)
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
        self._correct(tick)
        tick.seconds, tick.lost = switch_costs(tick.est, tick.current[0], n_nodes, tick.estimator)

    def _correct(self, tick: Tick) -> None:
        """Re-estimate with the saturated phase's work scaled to what it served (``planner.saturation``)."""
        sat, est, w = self.config.saturation, tick.est, tick.workload
        if sat is None or est is None or w is None:
            return
        found = self.queues.saturated(
            tick.view.now, sat, tick.view.last_switch_t, self.config.workload.window_s, early=tick.early
        )
        if found is None:
            return
        phase, held_s = found
        p_cur, n_nodes = tick.current[0], len(tick.view.nodes)
        i_cur = est.index(p_cur)
        model = est.prefill_capacity_rps[i_cur] if phase is Phase.PREFILL else est.decode_capacity_rps[i_cur]
        # Finished per second over the time the saturation has held (and the history covers).
        end = tick.view.now - self.config.workload.lag_s
        first = self.workload.first_t if self.workload.first_t is not None else end
        covered = min(held_s, end - first)
        measured = self.workload.estimate(tick.view.now, held_s).n / covered if covered > 0 else 0.0
        tick.inputs.update(saturated_prefill=float(phase is Phase.PREFILL), measured_rps=measured)
        tick.inputs["model_capacity_saturated_rps"] = float(model)

        def capacity(ws: list[WorkloadEstimate]) -> np.ndarray:
            ests = self.persistence.estimates(tick, ws, np.array([p_cur]))
            return np.array(
                [e.prefill_capacity_rps[0] if phase is Phase.PREFILL else e.decode_capacity_rps[0] for e in ests]
            )

        factor = correction(capacity, w, phase, measured, sat)
        if factor == 1.0:
            return
        tick.corrected = (phase, factor)
        tick.inputs["saturation_factor"] = factor
        tick.workload = w = scaled(w, phase, factor)
        tick.est = estimate_splits(
            self.profile,
            w,
            n_nodes,
            candidate_splits(self.config, n_nodes, p_cur),
            reference_prefill=p_cur,
            slo=tick.view.slo,
            kv_capacity_tokens=tick.kv_tokens,
            config=tick.estimator or self.config.estimator,
        )

    def _model_inputs(self) -> dict[str, float]:
        p, d = self.profile.prefill, self.profile.decode
        return {
            "prefill_samples": float(p.samples),
            "decode_samples": float(d.samples),
            # Relative one-sigma band of a step (IterationModel.noise_sigma).
            "prefill_sigma_ms": p.noise_sigma,
            "decode_sigma_ms": d.noise_sigma,
        }

    @staticmethod
    def _kv_tokens(view: ClusterView) -> float:
        caps = [n.kv_capacity_tokens for n in view.nodes if n.kv_capacity_tokens > 0]
        return float(np.mean(caps)) if caps else 0.0

    def _early(self, tick: Tick) -> Decision:
        """A throughput move before min_history_s (``EvolvingConfig.early_s``):
        the queues must show the phase that gains nodes saturated and the one
        that gives them up idle, and the model must point that way, with a
        gain of ``early_gain_frac`` or at least not against it: long requests
        are missing from an early estimate, so it under-states the starved
        phase, while a queue cannot lie about it."""
        cfg, est, lost, p_cur = self.config, tick.est, tick.lost, tick.current[0]
        assert est is not None and lost is not None
        p = est.prefill_nodes
        target = objective.throughput_target(est, ((p >= tick.lo) & (p <= tick.hi)) | (p == p_cur), p_cur)
        if target is None or target == p_cur:
            return self._finish(tick, (), "hold: early, current split is best", 0.0)
        frac = objective.throughput_gain(
            est, target, p_cur, float(lost[est.index(target)]), cfg.horizon_s, cfg.estimator.z
        )
        gainer, donor = (Phase.PREFILL, Phase.DECODE) if target > p_cur else (Phase.DECODE, Phase.PREFILL)
        waiting = {ph: [n.queue for n in tick.view.nodes if n.phase == ph] for ph in (gainer, donor)}
        q_gain = float(np.mean(waiting[gainer])) if waiting[gainer] else 0.0
        q_donor = float(np.mean(waiting[donor])) if waiting[donor] else 0.0
        tick.inputs.update(candidate_prefill=float(target), throughput_gain_lcb_frac=frac)
        tick.inputs.update(early_queue_gainer=q_gain, early_queue_donor=q_donor)
        starved = q_gain >= cfg.early_queue and q_donor < 1.0
        tie = cfg.early_tie_queue is not None and frac > -cfg.tie_frac and q_gain >= cfg.early_tie_queue
        if starved and (frac >= cfg.early_gain_frac or tie):
            why = f"early throughput: {frac:+.3f} served (lower bound), {q_gain:.1f} waiting per {gainer.value} node"
            return self._model_move(tick, target, why, 1.0)
        return self._finish(
            tick, (), f"hold: early, {target}P not clear yet ({frac:.3f}, queues {q_gain:.1f}/{q_donor:.1f})", 0.0
        )

    def _slo_repair(
        self, tick: Tick, in_range: np.ndarray, floor: int, ceiling: int, err_thr: float
    ) -> Decision | None:
        """The move back inside the SLO bounds when the breach held over the
        persist window and costs no throughput (net of the verified error
        ``err_thr``); None: the objective decides."""
        cfg, est, p_cur = self.config, tick.est, tick.current[0]
        assert est is not None
        p = est.prefill_nodes
        p_floor, p_ceiling = self.persistence.bounds(tick)
        if p_floor <= p_cur <= p_ceiling:
            tick.inputs["slo_breach_not_persisted"] = 1.0  # fall through: the objective may still move
            return None
        now, slo = tick.view.now, tick.view.slo
        measured = self.ttfts.p95(now, cfg.persist_s, tick.view.last_switch_t, cfg.min_requests)
        if p_cur < p_floor and measured is not None and measured <= cfg.slo_margin * slo.ttft_s:
            tick.inputs["measured_p95_ttft_s"] = measured  # the split meets the bound (planner.ttft)
            return None
        repair = in_range & (p >= p_floor) & (p <= max(p_floor, p_ceiling))
        target = objective.throughput_target(est, repair, p_cur)
        if target is None:  # bounds outside what can move now: go as far as allowed
            target = int(np.clip(p_floor if p_cur < p_floor else p_ceiling, tick.lo, tick.hi))
        gain = objective.predicted_gain(est, target, p_cur, "throughput")  # None: no base to lose from
        if gain is None or gain[0] - err_thr >= -cfg.tie_frac:
            why = f"SLO repair ({'TTFT' if p_cur < p_floor else 'TPOT'}): bounds [{floor}, {ceiling}]"
            return self._model_move(tick, target, why, 1.0, "throughput", repair_tolerance=cfg.tie_frac)
        tick.inputs["slo_breach_costs_throughput"] = 1.0  # overload: the objective decides
        return None

    def _by_model(self, tick: Tick) -> Decision:
        if tick.early:
            return self._early(tick)
        cfg, view = self.config, tick.view
        est, lost, p_cur = tick.est, tick.lost, tick.current[0]
        assert est is not None and lost is not None
        z, g, i_cur = cfg.estimator.z, cfg.min_gain_frac, est.index(p_cur)
        if self.verifier is not None and est.response_s[i_cur] < UNSTABLE_S:  # the split stood on, checked
            r, r_sd = float(est.response_s[i_cur]), float(est.response_sd_s[i_cur])
            miss = self.verifier.standing(view.now, r, r_sd, view.last_switch_t)
            if miss is not None:
                tick.inputs["standing_response_miss_frac"] = miss
        err_thr = self.verifier.error(view.now, "throughput") if self.verifier is not None else 0.0
        err_lat = self.verifier.error(view.now, "latency") if self.verifier is not None else 0.0
        tick.inputs.update(verified_error_throughput_frac=err_thr, verified_error_latency_frac=err_lat)
        # Upper bounds here, means in the persisted check: moving down needs
        # confidence, repairing up needs a breach that held (hysteresis).
        floor, ceiling = rule.slo_bounds(est, view.slo, cfg.slo_margin, z)
        tick.inputs.update(ttft_floor_prefill=float(floor), tpot_ceiling_prefill=float(ceiling))
        p = est.prefill_nodes
        in_range = (p >= tick.lo) & (p <= tick.hi)
        allowed = in_range & (p >= floor) & (p <= ceiling)
        tick.inputs.update(
            served_current_rps=float(est.served_rps[i_cur]),
            response_current_s=float(est.response_s[i_cur]),
            capacity_current_rps=float(est.capacity_rps[i_cur]),
        )
        if p_cur < floor or p_cur > ceiling:
            repaired = self._slo_repair(tick, in_range, floor, ceiling, err_thr)
            if repaired is not None:
                return repaired
        candidates = in_range | (p == p_cur)
        held: list[str] = []
        target = objective.throughput_target(est, candidates, p_cur, cfg.tie_frac, allowed)
        if target is not None and target != p_cur:
            i = est.index(target)
            frac = objective.throughput_gain(est, target, p_cur, float(lost[i]), cfg.horizon_s, z) - err_thr
            tick.inputs.update(candidate_prefill=float(target), throughput_gain_lcb_frac=frac)
            conf = rule.normal_confidence(
                float(est.served_rps[i] - est.served_rps[i_cur]) * cfg.horizon_s - float(lost[i]),
                float(est.served_gain_sd_rps[i]) * cfg.horizon_s,
            )
            gainer = Phase.PREFILL if target > p_cur else Phase.DECODE
            queued = self.queues.waiting_per_node(view.now, cfg.persist_s, gainer)
            open_loop = tick.workload is not None and tick.workload.closed_fraction < 0.5
            needs_queue = cfg.throughput_queue is not None and open_loop
            if frac >= g and needs_queue and (queued or 0.0) < (cfg.throughput_queue or 0.0):
                tick.inputs["gainer_waiting_per_node"] = queued or 0.0
                held.append(
                    f"throughput gain of {target}P: nothing waits at {gainer.value} nodes ({queued or 0.0:.2f})"
                )
            elif frac >= g:
                worst = self.persistence.worst_gain(tick, target, float(lost[i]), "throughput")
                tick.inputs["persisted_throughput_gain_frac"] = worst
                if worst >= g:
                    why = f"throughput: +{frac:.3f} served (lower bound)"
                    return self._model_move(tick, target, why, conf, "throughput")
                held.append(f"throughput gain of {target}P not persisted ({worst:.3f})")
            else:
                held.append(f"throughput gain of {target}P below threshold ({frac:.3f})")
        fast = objective.latency_target(est, candidates, p_cur, cfg.tie_frac, allowed)
        if fast is not None and fast != p_cur and (bool(allowed[est.index(fast)]) or not bool(allowed[i_cur])):
            frac = objective.latency_gain(est, fast, p_cur, z) - err_lat
            moved = self._latency_move(tick, fast, frac, held)
            if moved is not None:
                return moved
        else:
            self._latency_held(view.now, p_cur, None)
        return self._finish(tick, (), "hold: " + ("; ".join(held) or "current split is best"), 1.0)

    def _latency_move(self, tick: Tick, fast: int, frac: float, held: list[str]) -> Decision | None:
        """The move to ``fast`` for shorter responses (bound ``frac``), or None
        with why not in ``held``: the bound must clear, hold, persist, and
        the phase giving up a node must have headroom (module doc, rule 6)."""
        cfg, est, lost, now = self.config, tick.est, tick.lost, tick.view.now
        assert est is not None and lost is not None
        g, i_cur, j = cfg.min_gain_frac, est.index(tick.current[0]), est.index(fast)
        tick.inputs.update(latency_candidate_prefill=float(fast), response_gain_ucb_frac=frac)
        conf = rule.normal_confidence(float(est.response_s[i_cur] - est.response_s[j]), float(est.response_sd_s[j]))
        held_s = self._latency_held(now, tick.current[0], fast if frac >= g else None)
        tick.inputs["latency_bound_held_s"] = held_s
        donor = Phase.DECODE if fast > tick.current[0] else Phase.PREFILL
        busy = self.queues.waiting_per_node(now, cfg.persist_s, donor) or 0.0
        if frac < g:
            held.append(f"responses at {fast}P not clearly shorter ({frac:.3f})")
        elif cfg.throughput_queue is not None and busy >= cfg.throughput_queue:
            tick.inputs["donor_waiting_per_node"] = busy
            held.append(f"shorter responses at {fast}P, but {busy:.2f} wait per {donor.value} node: no headroom")
        elif held_s < cfg.latency_hold_s:
            held.append(f"shorter responses at {fast}P: bound held {held_s:g} s of {cfg.latency_hold_s:g}")
        else:
            worst = self.persistence.worst_gain(tick, fast, float(lost[j]), "latency")
            tick.inputs["persisted_response_gain_frac"] = worst
            if worst >= g:
                why = f"latency: responses {frac:.3f} shorter at {fast}P (bound), throughput kept"
                return self._model_move(tick, fast, why, conf, "latency")
            held.append(f"shorter responses at {fast}P not persisted ({worst:.3f})")
        return None

    def _latency_held(self, now: float, current: int, target: int | None) -> float:
        """Seconds the latency bound has cleared for ``target`` on every
        tick from ``current`` (0 on the first; None: it did not clear now)."""
        run = self._latency_run
        if target is None:
            self._latency_run = None
            return 0.0
        if run is None or run[:2] != (current, target):
            self._latency_run = run = (current, target, now)
        return now - run[2]

    # -- output --------------------------------------------------------------
    def _model_move(
        self,
        tick: Tick,
        target: int,
        why: str,
        confidence: float,
        kind: Kind | None = None,
        *,
        repair_tolerance: float | None = None,
    ) -> Decision:
        """A move the model asks for; refused when it undoes the last one too
        soon. A move of ``kind`` is checked once it has settled
        (``planner.verification``); early moves (None) are not; an SLO
        repair is reverted only when it cost more than ``repair_tolerance``."""
        p_cur, now = tick.current[0], tick.view.now
        last = self._last_move
        if last is not None and target == last[1] and now - last[0] < self.config.flap_window_s:
            tick.inputs["flap_window_left_s"] = self.config.flap_window_s - (now - last[0])
            return self._finish(
                tick, (), f"hold: {why}, but {target}P is what the move at t={last[0]:g} left (flap window)", 0.0
            )
        est = tick.est
        predicted = None if kind is None or est is None else objective.predicted_gain(est, target, p_cur, kind)
        if predicted is not None:
            tick.inputs.update(move_predicted_gain_frac=predicted[0], move_predicted_gain_sd_frac=predicted[1])
        decision = self._move(tick, target, why, confidence)
        if decision.acted:
            self._last_move = (now, p_cur, decision.chosen_split[0])
            if self.verifier is not None and predicted is not None and kind is not None:
                to_p = decision.chosen_split[0]
                self.verifier.start(now, p_cur, to_p, kind, *predicted, repair_tolerance=repair_tolerance)
        return decision

    def _pinned(self, tick: Tick) -> Decision | None:
        """The pins' decision (`rule.pin_actions`, the one pin rule the
        gateway's `enforce_pins` also follows): node pins first, then the
        split pin, which holds while a switch runs; None without a pin."""
        nodes, pin = tick.view.nodes, tick.view.pin
        if pin is None:
            return None
        actions = tuple(rule.pin_actions(nodes, pin))
        node_moves = [a.node_id for a in actions if a.node_id in pin.node_phases]
        why = f"split pin: {pin.prefill_nodes} prefill nodes"
        if node_moves:
            split_too = len(node_moves) < len(actions)
            reason = "node pin: " + ", ".join(node_moves) + (f"; {why}" if split_too else "")
            return self._finish(tick, actions, reason, 1.0)
        if pin.prefill_nodes is None:
            return None
        if any(n.draining for n in nodes):  # a draining node still counts in the phase it leaves
            return self._finish(tick, (), "hold: split pin; a switch is in progress", 1.0)
        if not actions:
            return self._finish(tick, (), f"hold: {why}; already there or nothing movable", 1.0)
        return self._finish(tick, actions, why, 1.0)

    def _move(self, tick: Tick, target: int, why: str, confidence: float) -> Decision:
        actions = rule.move_actions(tick.view.nodes, tick.current[0], target, tick.protected)
        if not actions:
            return self._finish(tick, (), f"hold: {why}; already there or nothing movable", confidence)
        return self._finish(tick, actions, why, confidence)

    def _finish(self, tick: Tick, actions: tuple[SwitchAction, ...], reason: str, confidence: float) -> Decision:
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
