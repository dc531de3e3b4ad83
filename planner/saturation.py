"""Capacity measured where one phase is saturated: the split model corrected
by what the cluster actually served.

The split model predicts each phase's capacity from the mix of *finished*
requests. Early on, and whenever requests are long, that mix is biased: the
long ones have not finished yet (a reasoning decode of minutes, a 40k-token
prompt queued behind others), so the model over-states the capacity of the
phase they load. On the DeepSeek-R1 trace at 1.6x load from 3P the model
said 3P served every offered request while 120 requests queued per decode
node, and the planner waited 160 s for the long decodes to finish before it
moved to 1P.

A queue cannot be biased that way. While one phase keeps requests
waiting (``queue_per_node`` or more per node, summed over its nodes, at
every tick of ``span_s``: a router can leave one node's queue long beside
others' full batches) and the other phase holds few of all waiting requests (under
``idle_per_node`` per node, or under ``other_share`` of the saturated
phase's), the saturated phase is busy all the time and is the bottleneck,
so the rate at which requests finish over the span is that phase's
capacity at the current split. (A queue that shrinks is still served at
capacity: the backlog left by a split that starved the phase drains at
exactly that rate.) When the model's capacity of that phase at the
current split is above the measured rate by more than ``margin``, the
phase's work per request is scaled (``scaled``) by the factor that makes
the model serve exactly the measured rate there (``correction``); every
split is then predicted with the corrected mix. Decode work is scaled
through the output length (its KV and batch context follow), prefill work
through the uncached prompt and its attention.

Pure: numbers in, numbers out; the planner (``planner.evolving``) feeds the
queues per tick and applies the factor.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from core import Phase
from planner.types import NodeState
from planner.workload import WorkloadEstimate


@dataclass(frozen=True)
class SaturationConfig:
    """queue_per_node: waiting requests per node of a phase, at every tick of
        the span, that make it saturated (> 0).
    idle_per_node / other_share: at every tick the other phase holds fewer
        than ``idle_per_node`` waiting requests per node, or fewer than
        ``other_share`` of the saturated phase's waiting requests (> 0 /
        (0, 1)): the saturated phase is the bottleneck, so the finish rate
        is its capacity. (A single prefill node in front of a backlog of
        hundreds of decodes has a few prompts waiting at times.)
    span_s: how long the saturation must have held (> 0), and the window
        over which the finish rate is measured; no switch may have happened
        within it (a draining node serves less).
    early_span_s: the span that suffices for decode queues before the
        planner's ``min_history_s`` (> 0, ≤ span_s; None = span_s); 10 s is
        the queues at two consecutive ticks of the default 10 s period.
        Only the early rule reads the predictions then, and it also needs
        the queues at the current tick and the corrected model's gain; the
        finished mix is at its most biased (the long answers have not
        finished), and every tick at the starving split is a backlog a
        full run never gets back. Prefill queues still need ``span_s``: a
        prefill finishes only after its decode, so early in a run the
        finish rate trails the prefills done (on Mooncake's conversation
        trace, 5.7 req/s measured at 20 s took the best split, 7P2D, to
        8P1D).
    margin: correct only when the model's capacity at the current split is
        above the measured rate by more than this fraction (≥ 0).
    max_factor: the largest correction (> 1).
    """

    queue_per_node: float = 2.0
    idle_per_node: float = 1.0
    other_share: float = 0.1
    span_s: float = 20.0
    early_span_s: float | None = 10.0
    margin: float = 0.1
    max_factor: float = 20.0

    def __post_init__(self) -> None:
        if self.queue_per_node <= 0 or self.idle_per_node <= 0 or self.span_s <= 0:
            raise ValueError("queue_per_node, idle_per_node and span_s must be > 0")
        if not 0 < self.other_share < 1:
            raise ValueError("other_share must be in (0, 1)")
        if self.early_span_s is not None and not 0 < self.early_span_s <= self.span_s:
            raise ValueError("early_span_s must be in (0, span_s] or None")
        if self.margin < 0 or self.max_factor <= 1:
            raise ValueError("margin must be >= 0 and max_factor > 1")


class QueueHistory:
    """Waiting requests and serving nodes of each phase, one entry per tick."""

    def __init__(self, retention_s: float) -> None:
        self.retention_s = retention_s
        # t, (prefill waiting, prefill nodes), (decode waiting, decode nodes)
        self._ticks: deque[tuple[float, tuple[float, int], tuple[float, int]]] = deque()

    def add(self, t: float, prefill: tuple[float, int], decode: tuple[float, int]) -> None:
        """One tick: (waiting requests, serving nodes) of each phase."""
        self._ticks.append((t, prefill, decode))
        while self._ticks and self._ticks[0][0] < t - self.retention_s:
            self._ticks.popleft()

    def saturated(
        self,
        now: float,
        cfg: SaturationConfig,
        last_switch_t: float | None,
        longest_s: float,
        early: bool = False,
    ) -> tuple[Phase, float] | None:
        """The phase saturated over at least the last ``span_s`` (module
        doc; decode's ``early_span_s`` when ``early``, i.e. before the
        planner's ``min_history_s``) and for how long it has been, up to
        ``longest_s``: the window to measure its finish rate over (the
        longer, the steadier). None if no phase is."""
        ticks = [x for x in self._ticks if x[0] >= now - max(cfg.span_s, longest_s)]
        if len(ticks) < 2:
            return None
        for phase in (Phase.PREFILL, Phase.DECODE):
            span = cfg.early_span_s if early and phase is Phase.DECODE and cfg.early_span_s is not None else cfg.span_s
            if last_switch_t is not None and last_switch_t > now - span:
                continue  # a draining node served less
            if self._ticks[0][0] > now - span:
                continue  # a history shorter than the span proves nothing
            start = now
            for t, pre, dec in reversed(ticks):  # back from now while the phase stayed busy
                mine, other = (pre, dec) if phase is Phase.PREFILL else (dec, pre)
                if not _busy(mine, other, cfg):
                    break
                start = t
            if start <= now - span:
                floor = max(now - longest_s, self._ticks[0][0], last_switch_t if last_switch_t is not None else -1e18)
                return phase, now - max(start, floor)
        return None

    def waiting_per_node(self, now: float, span_s: float, phase: Phase) -> float | None:
        """Mean over the ticks of the last ``span_s`` of ``phase``'s waiting
        requests per serving node (None: no tick with such nodes)."""
        ticks = [(pre if phase is Phase.PREFILL else dec) for t, pre, dec in self._ticks if t > now - span_s]
        per = [waiting / nodes for waiting, nodes in ticks if nodes > 0]
        return float(np.mean(per)) if per else None


def _busy(mine: tuple[float, int], other: tuple[float, int], cfg: SaturationConfig) -> bool:
    (waiting, nodes), (other_waiting, other_nodes) = mine, other
    if nodes <= 0 or waiting < cfg.queue_per_node * nodes:
        return False
    return other_waiting < max(cfg.idle_per_node * other_nodes, cfg.other_share * waiting)


def scaled(w: WorkloadEstimate, phase: Phase, factor: float) -> WorkloadEstimate:
    """``w`` with the per-request work of ``phase`` multiplied by ``factor``."""
    k = float(factor)
    if phase is Phase.DECODE:
        return replace(
            w,
            output_mean=w.output_mean * k,
            output_std=w.output_std * k,
            output_sq_mean=None if w.output_sq_mean is None else w.output_sq_mean * k * k,
            prompt_output_mean=None if w.prompt_output_mean is None else w.prompt_output_mean * k,
        )
    return replace(
        w,
        remote_uncached_mean=w.remote_uncached_mean * k,
        remote_uncached_std=w.remote_uncached_std * k,
        remote_pairs_mean=None if w.remote_pairs_mean is None else w.remote_pairs_mean * k,
    )


_GRID = 48  # factors tried, geometric from 1 to max_factor


def correction(
    capacity_at_current: Callable[[list[WorkloadEstimate]], np.ndarray],
    w: WorkloadEstimate,
    phase: Phase,
    measured_rps: float,
    cfg: SaturationConfig,
) -> float:
    """The factor (1 = none) that brings the model's capacity of ``phase``
    at the current split down to ``measured_rps``.

    ``capacity_at_current(workloads)``: that capacity for each workload (one
    vectorised model pass); it must not increase with the factor. 1 when the
    model is within ``margin`` of the measurement or the measurement is 0;
    ``max_factor`` when even that leaves the model above it.
    """
    if measured_rps <= 0:
        return 1.0
    factors = np.geomspace(1.0, cfg.max_factor, _GRID)
    caps = np.asarray(capacity_at_current([scaled(w, phase, f) for f in factors]), dtype=float)
    if not caps[0] > measured_rps * (1.0 + cfg.margin):
        return 1.0
    below = np.flatnonzero(caps <= measured_rps)
    if below.size == 0:
        return float(cfg.max_factor)
    j = int(below[0])  # caps[j - 1] > measured >= caps[j]: interpolate in log factor
    c0, c1 = caps[j - 1], caps[j]
    frac = (c0 - measured_rps) / (c0 - c1) if c0 > c1 else 1.0
    return float(np.exp(np.log(factors[j - 1]) + frac * (np.log(factors[j]) - np.log(factors[j - 1]))))


def waiting_by_phase(nodes: tuple[NodeState, ...]) -> tuple[tuple[float, int], tuple[float, int]]:
    """(waiting requests, serving nodes) of each phase, prefill then decode:
    what ``QueueHistory.add`` takes for one tick."""
    out = []
    for phase in (Phase.PREFILL, Phase.DECODE):
        q = [n.queue for n in nodes if n.phase == phase and not n.draining]
        out.append((float(sum(q)), len(q)))
    return out[0], out[1]
