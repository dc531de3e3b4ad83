"""Baseline planners for comparison: a static split, a time-table of splits
(the simulator's clairvoyant reference) and a Dynamo-like load planner.

Dynamo's load-based planner, as NVIDIA documents it: every metric-pulling
interval it samples the prefill queue and the decode workers' KV-cache
utilisation; every adjustment interval it compares the interval's averages
with scale-up / scale-down thresholds and changes each worker pool by at
most one; while a change is in progress it pulls no metrics and makes no
adjustment. Changes are realised by launching / stopping worker processes.

Adaptation to this product's fixed node pool (an assumption of ours): a node
only changes role, so the per-pool demands dp, dd ∈ {−1, 0, +1} (from the
thresholds) resolve into one relaunch toward the pool with the strictly
higher demand: dp > dd moves one decode node to prefill, dd > dp the
reverse, ties hold. A relaunched node is out of service and the planner is
blocked for ``relaunch_delay_s``.

Metric definitions (assumptions where the docs are vague): prefill load =
waiting requests per prefill worker (``NodeState.queue`` summed over prefill
nodes ÷ their count); decode load = mean ``kv_usage`` of decode nodes.
Defaults follow the documented CLI defaults (adjustment interval 10 s; KV
0.9 / 0.5; prefill queue 0.5 / 0.2) and the reference study's 754 s
relaunch on GB300. Not modelled: Dynamo's grace period after adding a
decode worker and its prefill-queue trend buffer.
"""

from __future__ import annotations

from dataclasses import dataclass

from core import Phase
from planner import decision as rule
from planner.types import ClusterView, Decision, IterationRecord, PlannerMode, RequestSample, SwitchAction


class _Blind:
    """Observes nothing: the split is decided without looking at the load."""

    def observe_iterations(self, records: list[IterationRecord]) -> None:
        return None

    def observe_requests(self, samples: list[RequestSample]) -> None:
        return None


def _split(view: ClusterView) -> tuple[int, int]:
    p = sum(1 for n in view.nodes if n.phase == Phase.PREFILL)
    return p, len(view.nodes) - p


class StaticPlanner(_Blind):
    """A fixed split of ``prefill_nodes`` prefill nodes; never switches and
    honours nothing else (the simulator sets the split up from it)."""

    name = "static"
    switch_kind = "inplace"

    def __init__(self, prefill_nodes: int) -> None:
        if prefill_nodes < 0:
            raise ValueError("prefill_nodes must be >= 0")
        self.prefill_nodes = prefill_nodes

    def decide(self, view: ClusterView) -> Decision:
        split = _split(view)
        return Decision(
            t=view.now,
            planner=self.name,
            current_split=split,
            chosen_split=split,
            actions=(),
            acted=False,
            reason=f"static: fixed at {self.prefill_nodes} prefill nodes",
            confidence=1.0,
        )


class ScheduledPlanner(_Blind):
    """Follows a time table of splits: ``schedule`` is ``[(from_t, prefill_nodes), ...]``
    and from each ``from_t`` on the planner moves the split to that count
    (in place, as many nodes at once as needed). The simulator's oracle
    search uses it to measure what a clairvoyant piecewise-static split
    achieves; it reads no load and honours pins like the others."""

    name = "schedule"
    switch_kind = "inplace"

    def __init__(self, schedule: list[tuple[float, int]]) -> None:
        if not schedule or any(p < 0 for _, p in schedule):
            raise ValueError("schedule needs at least one (from_t, prefill_nodes >= 0) entry")
        self.schedule = sorted((float(t), int(p)) for t, p in schedule)

    def target(self, now: float) -> int:
        """The scheduled prefill count at ``now`` (the first entry's before it starts)."""
        current = self.schedule[0][1]
        for t, p in self.schedule:
            if t <= now:
                current = p
        return current

    def decide(self, view: ClusterView) -> Decision:
        split = _split(view)
        target = min(self.target(view.now), len(view.nodes))
        actions = rule.move_actions(view.nodes, split[0], target, rule.protected_ids(view.nodes, view.pin))
        acted = view.mode == PlannerMode.AUTO and bool(actions)
        return Decision(
            t=view.now,
            planner=self.name,
            current_split=split,
            chosen_split=rule.split_after(split, actions, view.nodes),
            actions=actions if acted else (),
            acted=acted,
            reason=f"schedule: {target} prefill nodes from now",
            confidence=1.0,
        )


@dataclass(frozen=True)
class DynamoConfig:
    """adjustment_interval_s: seconds between threshold comparisons (> 0).
    prefill_queue_scale_up / _down: waiting requests per prefill worker above
        which one is added / below which one is removed (up > down ≥ 0).
    decode_kv_scale_up / _down: mean decode KV utilisation, in [0, 1], above
        which a decode worker is added / below which one is removed (up > down).
    relaunch_delay_s: seconds a relaunched node is out of service; planner
        blocked meanwhile (≥ 0; 754 s on GB300 in the reference study).
    min_prefill / min_decode: workers each pool keeps (≥ 1; Dynamo's min GPU budget).
    """

    adjustment_interval_s: float = 10.0
    prefill_queue_scale_up: float = 0.5
    prefill_queue_scale_down: float = 0.2
    decode_kv_scale_up: float = 0.9
    decode_kv_scale_down: float = 0.5
    relaunch_delay_s: float = 754.0
    min_prefill: int = 1
    min_decode: int = 1

    def __post_init__(self) -> None:
        if self.adjustment_interval_s <= 0 or self.relaunch_delay_s < 0:
            raise ValueError("adjustment_interval_s must be > 0 and relaunch_delay_s >= 0")
        if not 0 <= self.prefill_queue_scale_down < self.prefill_queue_scale_up:
            raise ValueError("need 0 <= prefill_queue_scale_down < prefill_queue_scale_up")
        if not 0 <= self.decode_kv_scale_down < self.decode_kv_scale_up <= 1:
            raise ValueError("need 0 <= decode_kv_scale_down < decode_kv_scale_up <= 1")
        if self.min_prefill < 1 or self.min_decode < 1:
            raise ValueError("min_prefill and min_decode must be >= 1")


class DynamoPlanner:
    """Dynamo-like load planner (module doc). State: metric samples of the
    current interval, the next adjustment time, and the end of the block."""

    name = "dynamo"
    switch_kind = "relaunch"

    def __init__(self, config: DynamoConfig | None = None) -> None:
        self.config = config or DynamoConfig()
        self._samples: list[tuple[float, float]] = []
        self._next_adjust_t: float | None = None
        self._blocked_until: float | None = None

    @property
    def relaunch_delay_s(self) -> float:
        return self.config.relaunch_delay_s

    def observe_iterations(self, records: list[IterationRecord]) -> None:
        return None  # load-based: reads only the cluster view

    def observe_requests(self, samples: list[RequestSample]) -> None:
        return None

    def decide(self, view: ClusterView) -> Decision:
        cfg = self.config
        prefill = [n for n in view.nodes if n.phase == Phase.PREFILL]
        decode = [n for n in view.nodes if n.phase == Phase.DECODE]
        split = (len(prefill), len(decode))
        if self._blocked_until is not None and view.now < self._blocked_until:
            return self._decision(view, split, (), f"blocked: relaunch in progress until t={self._blocked_until:g}", {})
        if self._next_adjust_t is None:
            self._next_adjust_t = view.now + cfg.adjustment_interval_s
        queue = sum(n.queue for n in prefill) / len(prefill) if prefill else 0.0
        kv = sum(n.kv_usage for n in decode) / len(decode) if decode else 0.0
        self._samples.append((queue, kv))
        if view.now < self._next_adjust_t:
            return self._decision(
                view, split, (), "collecting metrics", {"prefill_queue_per_worker": queue, "decode_kv_usage": kv}
            )
        q_avg = sum(s[0] for s in self._samples) / len(self._samples)
        kv_avg = sum(s[1] for s in self._samples) / len(self._samples)
        self._samples = []
        self._next_adjust_t = view.now + cfg.adjustment_interval_s
        dp = 1 if q_avg > cfg.prefill_queue_scale_up else (-1 if q_avg < cfg.prefill_queue_scale_down else 0)
        dd = 1 if kv_avg > cfg.decode_kv_scale_up else (-1 if kv_avg < cfg.decode_kv_scale_down else 0)
        inputs = {
            "prefill_queue_per_worker": q_avg,
            "decode_kv_usage": kv_avg,
            "prefill_demand": float(dp),
            "decode_demand": float(dd),
        }
        protected = rule.protected_ids(view.nodes, view.pin)
        target = split[0]
        if dp > dd and split[1] > cfg.min_decode:
            target = split[0] + 1
        elif dd > dp and split[0] > cfg.min_prefill:
            target = split[0] - 1
        actions = rule.move_actions(view.nodes, split[0], target, protected)
        if not actions:
            return self._decision(view, split, (), f"hold: prefill demand {dp:+d}, decode demand {dd:+d}", inputs)
        to = actions[0].to_phase.value
        reason = f"relaunch {actions[0].node_id} as {to}: prefill demand {dp:+d}, decode demand {dd:+d}"
        return self._decision(view, split, actions, reason, inputs)

    def _decision(
        self,
        view: ClusterView,
        split: tuple[int, int],
        actions: tuple[SwitchAction, ...],
        reason: str,
        inputs: dict[str, float],
    ) -> Decision:
        acted = view.mode == PlannerMode.AUTO and bool(actions)
        chosen = rule.split_after(split, actions, view.nodes)
        if acted:
            self._blocked_until = view.now + self.config.relaunch_delay_s
            self._next_adjust_t = self._blocked_until + self.config.adjustment_interval_s
            self._samples = []
        elif actions:
            reason = f"{view.mode.value}: would {reason}"
        if self._blocked_until is not None:
            inputs = {**inputs, "blocked_until": self._blocked_until}
        return Decision(
            t=view.now,
            planner=self.name,
            current_split=split,
            chosen_split=chosen,
            actions=actions if acted else (),
            acted=acted,
            reason=reason,
            confidence=1.0,
            inputs=inputs,
        )
