"""An in-memory `ClusterControl` + `ClusterHistory` for the admin API's tests:
two nodes, every call recorded."""

from __future__ import annotations

from typing import Any

from core import Phase
from gateway.control.ports import ClusterSnapshot, NodeSnapshot, PlannerState, SplitSample
from gateway.kv.views import BranchSummary, DirectoryStatus
from gateway.store.records import SwitchOutcome
from planner.types import PlannerMode


class FakeClusterControl:
    """In-memory ClusterControl + ClusterHistory: two nodes, records calls."""

    def __init__(self) -> None:
        self.phases = {"n0": Phase.PREFILL, "n1": Phase.DECODE}
        self.node_pins: dict[str, Phase] = {}
        self.split_pin: int | None = None
        self.mode = "auto"
        self.calls: list[tuple[Any, ...]] = []

    async def snapshot(self) -> ClusterSnapshot:
        nodes = [
            NodeSnapshot(
                node_id=n,
                url=f"http://{n}",
                phase=p,
                draining_to=None,
                healthy=True,
                pinned_phase=self.node_pins.get(n),
                queue=1,
                running=2,
                kv_usage=0.5,
                tokens_per_s=100.0,
            )
            for n, p in self.phases.items()
        ]
        prefill = sum(p is Phase.PREFILL for p in self.phases.values())
        return ClusterSnapshot(
            nodes=nodes,
            split=(prefill, len(nodes) - prefill),
            split_pin=self.split_pin,
            directory=DirectoryStatus(blocks=10),
            top_branches=[BranchSummary(branch_id="b", tenant_id="t", blocks=3)],
        )

    async def planner_state(self) -> PlannerState:
        return PlannerState(mode=PlannerMode(self.mode), planner="online")

    async def set_mode(self, mode: str) -> None:
        self.mode = mode

    async def pin_split(self, prefill_nodes: int | None) -> None:
        self.split_pin = prefill_nodes

    async def pin_node(self, node_id: str, phase: Phase | None) -> None:
        if phase is None:
            self.node_pins.pop(node_id, None)
        else:
            self.node_pins[node_id] = phase

    async def switch(self, node_id: str, to_phase: Phase, *, reason: str, who: str) -> SwitchOutcome:
        self.calls.append(("switch", node_id, to_phase, reason, who))
        before, self.phases[node_id] = self.phases[node_id], Phase(to_phase)
        return SwitchOutcome(node_id, before, Phase(to_phase), drain_s=0.5, migrate_s=1.0, total_s=1.6, outcome="ok")

    async def restore_pins(
        self, split_pin: int | None, node_pins: dict[str, Phase], *, who: str
    ) -> list[SwitchOutcome]:
        self.split_pin, self.node_pins = split_pin, dict(node_pins)
        return []

    async def split_history(self, since_s: float) -> list[SplitSample]:
        self.calls.append(("history", since_s))
        return [SplitSample(t=1.0, prefill=1, decode=1, tokens_per_s=50.0)]
