"""Settings of the evolving planner (`planner.evolving`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.estimator_config import EstimatorConfig
from planner.regression import RLSConfig
from planner.saturation import SaturationConfig
from planner.verification import VerifyConfig
from planner.workload import WorkloadConfig


@dataclass(frozen=True)
class EvolvingConfig:
    """Settings of the evolving planner (validated at construction).

    horizon_s: seconds over which a switch's gain is amortised against its cost (> 0).
    min_gain_frac: required net gain, a fraction of the current split's served
        throughput × horizon, or of its mean response time (≥ 0); the band
        of hysteresis around the current split.
    tie_frac: throughput differences below this fraction are ties, decided
        by response time ([0, min_gain_frac / (1 + min_gain_frac))): a move
        for shorter responses may not cost more throughput than this, so a
        throughput move and a latency move can never undo each other.
    flap_window_s: a model-based move back to the split the last move left,
        sooner than this after it, is refused (≥ 0; 0 = off). The gain that
        justified the move was counted over `horizon_s`: undoing it sooner
        says the estimate was noise.
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
    early_s / early_gain_frac / early_queue: before ``min_history_s``, after
        ``early_s`` of history (≥ 0; None = never), a throughput move is
        taken when its gain's lower bound reaches ``early_gain_frac`` (≥
        min_gain_frac) and what the nodes report agrees: the phase that
        gains nodes has at least ``early_queue`` requests waiting per node
        (> 0) and the phase that gives them up has less than one. A split
        that starves one phase shows it in its queues within seconds, long
        before the estimate of the slow requests is complete; this bounds
        convergence from a bad start without trusting an early mix alone.
        History runs from the first finished request's arrival, a moment
        after the traffic began, so 15 s lets the tick at 20 s act (at 20 s,
        a run whose first request came 0.3 s in waited for the tick at 30 s).
    early_tie_queue: an early move whose gain's lower bound is only a tie
        (above -tie_frac) is still taken when this many requests wait per
        node of the gaining phase (> 0; None = never): a bet on the queue
        against an estimate known to be incomplete. A replay's first
        turns arrive together, so such a queue also forms at a split that
        serves the load (Mooncake conversation near, from the best split
        7P: 8.6 per prefill node at 30 s, moved to 8P1D, 525 waiting at the
        one decode node by 180 s). Off by default: without it that case
        makes no early move, and Mooncake synthetic overload from 3P (seed
        1), where early moves matter most, moves at the same ticks and
        serves the same (41,739).
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
    saturation: when a phase's queues show it saturated, correct its
        modelled capacity to the measured finish rate (``planner.saturation``);
        None = never.
    throughput_queue: on open-loop traffic (most finished requests with no
        known gap), a throughput move must feed a phase that kept at least
        this many requests waiting per node, on average over ``persist_s``
        (> 0; None = no such check). Open loop, a split serves min(offered,
        capacity): while nothing waits at the phase a move would give nodes
        to, that phase already serves everything that reaches it, so the
        move cannot raise throughput whatever the model predicts. In a
        closed loop faster service raises the offered rate itself (agents
        come back sooner), so a gain needs no queue: on `shift`'s math hour
        the decode nodes run big batches, nothing waits, and 1P serves 9 %
        more than 3P. One waiting request per node is the least that says
        the phase had work it could not start.
    latency_hold_s: a latency move's bound (responses shorter at the upper
        bound, throughput kept) must have cleared ``min_gain_frac`` for the
        same target on every tick this long (≥ 0; 0 = one tick). A response
        gain lives on the headroom of the phase that gives up a node, and
        near that phase's saturation its estimate swings with each window's
        mix (long prompts are heavy-tailed and come in sessions) far more
        than the means' standard errors say: on Mooncake conversation at
        its best split one window's lighter prompts showed 6P 21 % faster
        than 7P, the windows 10 and 20 s before showed it slower, and the
        move saturated prefill (-21 %). A bound that holds as the window
        slides over ``persist_s`` of traffic is evidence; one window is
        not (the default is ``persist_s``: the window, 60 s, then holds
        none of the traffic the first clearing tick saw). Throughput moves are not held: the sub-window check and the
        queue rule already ask them for persistence, and they repair a
        shortfall, where waiting costs served requests.
    verify: check every model move once it has settled (``planner.verification``):
        revert one that did not deliver, and count the verified error against
        later gains of its kind; None = never.
    workload / estimator / regression: the sub-components' configs. The
        workload window defaults to 60 s = persist_s, so that once a shift
        has persisted the estimate holds only post-shift traffic; its chunk
        size must be the estimator's token budget (one engine); at run time
        both follow the budget the nodes report (``with_engine_limits``).
    """

    horizon_s: float = 600.0
    min_gain_frac: float = 0.05
    tie_frac: float = 0.02
    flap_window_s: float = 600.0
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
    early_s: float | None = 15.0
    early_gain_frac: float = 0.1
    early_queue: float = 2.0
    early_tie_queue: float | None = None
    key_by_report: bool = True
    offered_mix: bool = True
    offered_max_weight: float = 10.0
    workload: WorkloadConfig = field(default_factory=lambda: WorkloadConfig(window_s=60.0))
    estimator: EstimatorConfig = field(default_factory=EstimatorConfig)
    regression: RLSConfig = field(default_factory=RLSConfig)
    saturation: SaturationConfig | None = field(default_factory=SaturationConfig)
    throughput_queue: float | None = 1.0
    latency_hold_s: float = 60.0
    verify: VerifyConfig | None = field(default_factory=VerifyConfig)

    def __post_init__(self) -> None:  # noqa: C901 - a flat list of one check per field
        if self.horizon_s <= 0 or self.persist_s <= 0 or self.min_gain_frac < 0 or self.cooldown_s < 0:
            raise ValueError("horizon_s, persist_s must be > 0; min_gain_frac, cooldown_s >= 0")
        if self.tie_frac < 0 or (self.tie_frac > 0 and self.tie_frac >= self.min_gain_frac / (1 + self.min_gain_frac)):
            raise ValueError("need 0 <= tie_frac < min_gain_frac / (1 + min_gain_frac)")
        if self.flap_window_s < 0:
            raise ValueError("flap_window_s must be >= 0")
        if self.persist_s > self.workload.retention_s:
            raise ValueError("persist_s must not exceed workload.retention_s")
        if self.persist_buckets < 1 or self.min_bucket_requests < 1 or self.min_requests < 1:
            raise ValueError("persist_buckets, min_bucket_requests, min_requests must be >= 1")
        if self.min_prefill < 0 or self.min_decode < 1:
            raise ValueError("min_prefill must be >= 0 and min_decode >= 1")
        if self.max_nodes_per_decision is not None and self.max_nodes_per_decision < 1:
            raise ValueError("max_nodes_per_decision must be >= 1 or None")
        if self.min_history_s < 0:
            raise ValueError("min_history_s must be >= 0")
        if self.early_s is not None and (self.early_s < 0 or self.early_gain_frac < self.min_gain_frac):
            raise ValueError("early_s must be >= 0 and early_gain_frac >= min_gain_frac")
        if self.early_queue <= 0 or (self.early_tie_queue is not None and self.early_tie_queue <= 0):
            raise ValueError("early_queue and early_tie_queue must be > 0")
        if self.latency_hold_s < 0:
            raise ValueError("latency_hold_s must be >= 0")
        if self.throughput_queue is not None and self.throughput_queue <= 0:
            raise ValueError("throughput_queue must be > 0 or None")
        if self.offered_max_weight < 1:
            raise ValueError("offered_max_weight must be >= 1")
        if not 0 < self.slo_margin <= 1:
            raise ValueError("slo_margin must be in (0, 1]")
        if self.workload.chunk_tokens != self.estimator.prefill_token_budget:
            raise ValueError("workload.chunk_tokens must equal estimator.prefill_token_budget (one engine)")
