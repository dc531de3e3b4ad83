"""Pure pieces of the evolving planner's decision rule.

Gain is measured in requests over an amortisation horizon H:
``net(P) = gain_rps(P)·H − lost_requests(P)`` where gain is the capacity
gain over the current split and lost_requests the switch cost; its lower
confidence bound uses ``gain − z·sd``. A split is worth moving to when
``net_lcb / (capacity_now·H)`` clears the configured fraction.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from core import Phase
from planner.estimator import SplitEstimate
from planner.types import SLO, NodeState, Pin, SwitchAction


@dataclass(frozen=True)
class NetGain:
    """Per-split arrays aligned with the estimate: requests over the horizon."""

    mean: np.ndarray
    lcb: np.ndarray
    sd: np.ndarray


def net_gain(est: SplitEstimate, lost_requests: np.ndarray, horizon_s: float, z: float) -> NetGain:
    """Capacity gain × horizon − switch cost, with its lower bound and sd."""
    mean = est.gain_rps * horizon_s - lost_requests
    sd = est.gain_sd_rps * horizon_s
    return NetGain(mean=mean, lcb=mean - z * sd, sd=sd)


def gain_fraction(net: float, current_capacity_rps: float, horizon_s: float) -> float:
    """Net requests gained as a fraction of what the current split serves
    over the horizon at capacity (inf when the current split serves nothing)."""
    base = current_capacity_rps * horizon_s
    if base <= 0 or not math.isfinite(base):
        return math.inf if net > 0 else 0.0
    return net / base


def normal_confidence(mean: float, sd: float) -> float:
    """P(X > 0) for X ~ N(mean, sd²); 1 or 0 when sd is 0."""
    if sd <= 0:
        return 1.0 if mean > 0 else 0.0
    return 0.5 * (1.0 + math.erf(mean / (sd * math.sqrt(2.0))))


def slo_bounds(est: SplitEstimate, slo: SLO, margin: float, z: float = 0.0) -> tuple[int, int]:
    """(floor, ceiling) on prefill nodes from the SLOs, within the estimated splits.

    floor: fewest prefill nodes whose P95 TTFT upper bound (mean + z·sd) ≤
    margin·slo.ttft_s; ceiling: most prefill nodes whose TPOT upper bound ≤
    margin·slo.tpot_s. An SLO no split can meet (overload) sets no bound: the
    capacity objective decides. When the two conflict the TTFT floor wins:
    the ceiling is raised to the floor.
    """
    p = est.prefill_nodes
    ok = est.ttft_s + z * est.ttft_sd_s <= slo.ttft_s * margin
    floor = int(p[ok].min()) if ok.any() else int(p.min())
    ok = est.tpot_s + z * est.tpot_sd_s <= slo.tpot_s * margin
    ceiling = int(p[ok].max()) if ok.any() else int(p.max())
    return floor, max(floor, ceiling)


def best_split(est: SplitEstimate, score: np.ndarray, allowed: np.ndarray, current: int) -> int | None:
    """Allowed split with the highest score; ties go to the one nearest the
    current split (fewest moves). None when nothing is allowed."""
    if not allowed.any():
        return None
    idx = np.flatnonzero(allowed)
    best = score[idx].max()
    ties = idx[score[idx] >= best - 1e-9 * max(abs(best), 1.0)]
    return int(est.prefill_nodes[ties[np.argmin(np.abs(est.prefill_nodes[ties] - current))]])


def protected_ids(nodes: Sequence[NodeState], pin: Pin | None) -> set[str]:
    """Nodes the planner must never move on its own: pinned or draining."""
    pinned = set(pin.node_phases) if pin else set()
    return {n.node_id for n in nodes if n.pinned or n.draining or n.node_id in pinned}


def node_pin_actions(nodes: Sequence[NodeState], pin: Pin | None) -> list[SwitchAction]:
    """Switches that bring phase-pinned nodes to their pinned phase (not while
    they drain); unknown node ids are ignored."""
    if not pin or not pin.node_phases:
        return []
    return [
        SwitchAction(n.node_id, pin.node_phases[n.node_id])
        for n in sorted(nodes, key=lambda n: n.node_id)
        if n.node_id in pin.node_phases and n.phase != pin.node_phases[n.node_id] and not n.draining
    ]


def pin_actions(nodes: Sequence[NodeState], pin: Pin | None) -> list[SwitchAction]:
    """Every switch the pins call for, the one pin rule of the planner and of
    the gateway's `enforce_pins`: node pins first (`node_pin_actions`), then
    the split pin moves nodes neither pinned nor draining, the least loaded
    first (`choose_nodes`), until the prefill count equals it, as far as those
    nodes allow. The split pin waits while any node drains: a draining node
    still reports the phase it leaves, so counting it would move one node too
    many (a leader elected while its predecessor's switch runs sees that)."""
    actions = node_pin_actions(nodes, pin)
    if pin is None or pin.prefill_nodes is None or any(n.draining for n in nodes):
        return actions
    after = {a.node_id: a.to_phase for a in actions}
    prefill = sum(1 for n in nodes if after.get(n.node_id, n.phase) == Phase.PREFILL)
    protected = protected_ids(nodes, pin)
    if prefill < pin.prefill_nodes:
        moved = choose_nodes(nodes, Phase.DECODE, pin.prefill_nodes - prefill, protected)
        return actions + [SwitchAction(n, Phase.PREFILL) for n in moved]
    moved = choose_nodes(nodes, Phase.PREFILL, prefill - pin.prefill_nodes, protected)
    return actions + [SwitchAction(n, Phase.DECODE) for n in moved]


def reachable(nodes: Sequence[NodeState], current_prefill: int, protected: set[str]) -> tuple[int, int]:
    """[lo, hi] prefill counts reachable by moving only unprotected nodes."""
    movable_p = sum(1 for n in nodes if n.phase == Phase.PREFILL and n.node_id not in protected)
    movable_d = sum(1 for n in nodes if n.phase == Phase.DECODE and n.node_id not in protected)
    return current_prefill - movable_p, current_prefill + movable_d


def choose_nodes(nodes: Iterable[NodeState], from_phase: Phase, count: int, protected: set[str]) -> list[str]:
    """The ``count`` least-loaded movable nodes of ``from_phase``: fewest
    waiting + running requests, then least KV in use, then node id."""
    pool = [n for n in nodes if n.phase == from_phase and n.node_id not in protected]
    pool.sort(key=lambda n: (n.queue + n.running, n.kv_usage, n.node_id))
    return [n.node_id for n in pool[: max(count, 0)]]


def move_actions(
    nodes: Sequence[NodeState], current_prefill: int, target_prefill: int, protected: set[str]
) -> tuple[SwitchAction, ...]:
    """Actions that move the split from current to target prefill nodes (as
    far as movable nodes allow)."""
    delta = target_prefill - current_prefill
    if delta == 0:
        return ()
    src, dst = (Phase.DECODE, Phase.PREFILL) if delta > 0 else (Phase.PREFILL, Phase.DECODE)
    return tuple(SwitchAction(i, dst) for i in choose_nodes(nodes, src, abs(delta), protected))


def split_after(
    current: tuple[int, int], actions: Iterable[SwitchAction], nodes: Sequence[NodeState]
) -> tuple[int, int]:
    """(prefill, decode) once ``actions`` are applied."""
    phase = {n.node_id: n.phase for n in nodes}
    p, d = current
    for a in actions:
        if phase.get(a.node_id) not in (None, a.to_phase):
            p, d = (p + 1, d - 1) if a.to_phase == Phase.PREFILL else (p - 1, d + 1)
    return p, d
