"""The port the admin API uses to read and steer the live cluster.

Implemented by the gateway's cluster runtime (`gateway.control.runtime`); the admin
API (`gateway.admin`) depends only on this Protocol, so it is tested with a
fake. All methods are async and may take as long as a switch takes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from core import Phase
from gateway.control.health import NodeHealth
from gateway.kv.views import BranchSummary, DirectoryStatus
from gateway.store.records import SwitchOutcome
from planner.types import Decision, PlannerMode, SplitPrediction
from workers.protocol import EngineState


@dataclass(frozen=True)
class NodeSnapshot:
    """One worker as the admin API shows it (its `/admin/cluster` node model)."""

    node_id: str
    url: str
    phase: Phase
    draining_to: Phase | None  # the phase it is switching to
    healthy: bool
    pinned_phase: Phase | None
    queue: int  # waiting requests
    running: int
    kv_usage: float  # 0..1 of device KV in use
    tokens_per_s: float
    health: NodeHealth = NodeHealth.HEALTHY  # gateway.control.health
    engine: EngineState = EngineState.ALIVE  # the engine core, as the worker last reported it


@dataclass(frozen=True)
class ClusterSnapshot:
    nodes: list[NodeSnapshot]
    split: tuple[int, int]  # (prefill, decode)
    split_pin: int | None  # pinned number of prefill nodes
    directory: DirectoryStatus = field(default_factory=DirectoryStatus)
    top_branches: list[BranchSummary] = field(default_factory=list)  # most blocks first


@dataclass(frozen=True)
class LeadershipStatus:
    """Planner leadership as one replica sees it (`gateway.control.leadership`)."""

    replica: str  # the replica answering
    leader: str | None  # the lease holder, None while nobody holds it
    term: int  # the newest leadership term this replica knows
    leading: bool  # the answering replica's planner acts now
    store_reachable: bool = True


@dataclass(frozen=True)
class PlannerState:
    """What the planner is doing: its mode, its name, its latest decision and
    its latest prediction per split, made at `predictions_t` (unix s). A
    decision taken without enough data carries no prediction, so the
    predictions may be older than the decision (even from before a restart:
    the runtime seeds them from the stored decisions). On a follower the
    decision and predictions are the leader's (read from the store), never
    ones of its own."""

    mode: PlannerMode
    planner: str
    last_decision: Decision | None = None
    predictions: tuple[SplitPrediction, ...] = ()
    predictions_t: float | None = None
    leadership: LeadershipStatus | None = None  # None: one gateway, no election


class Leadership(Protocol):
    """Which replica's planner acts (`gateway.control.leadership.LeaderElector`)."""

    def is_leader(self) -> bool:
        """May this replica decide and send orders now?"""

    def order_term(self) -> int:
        """The leadership term this replica's orders carry."""

    def status(self) -> LeadershipStatus: ...

    def deposed(self, newer_term: int | None = None, why: str = "") -> None:
        """A worker refused an order as stale: stop acting at once."""


@dataclass(frozen=True)
class SplitSample:
    t: float  # unix seconds
    prefill: int
    decode: int
    tokens_per_s: float


class ClusterControl(Protocol):
    async def snapshot(self) -> ClusterSnapshot: ...

    async def planner_state(self) -> PlannerState: ...

    async def set_mode(self, mode: str) -> None:
        """Raises `InvalidRequest` for anything but auto / advisory / manual."""

    async def pin_split(self, prefill_nodes: int | None) -> None:
        """Pin the number of prefill nodes (None unpins). Realised by switches."""

    async def pin_node(self, node_id: str, phase: Phase | None) -> None:
        """Pin one node's phase (None unpins). Switches it now if needed."""

    async def restore_pins(
        self, split_pin: int | None, node_pins: dict[str, Phase], *, who: str
    ) -> list[SwitchOutcome]:
        """Set both pins at once (pins of nodes that are not workers are
        dropped with a warning) and realise them with switches."""

    async def switch(self, node_id: str, to_phase: Phase, *, reason: str, who: str) -> SwitchOutcome: ...


class ClusterHistory(Protocol):
    async def split_history(self, since_s: float) -> list[SplitSample]:
        """Samples over the last `since_s` seconds, oldest first."""
