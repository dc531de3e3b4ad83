"""The port the admin API uses to read and steer the live cluster.

Implemented by the gateway's cluster runtime (`gateway.cluster`); the admin
API (`gateway.admin`) depends only on this Protocol, so it is tested with a
fake. All methods are async and may take as long as a switch takes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class NodeSnapshot:
    node_id: str
    url: str
    phase: str  # "prefill" | "decode"
    draining_to: str | None
    healthy: bool
    pinned_phase: str | None
    queue: int
    running: int
    kv_usage: float
    tokens_per_s: float


@dataclass(frozen=True)
class ClusterSnapshot:
    nodes: list[NodeSnapshot]
    split: tuple[int, int]  # (prefill, decode)
    split_pin: int | None  # pinned number of prefill nodes
    directory: dict[str, float] = field(default_factory=dict)  # blocks, bytes, referenced, hit_rate
    top_branches: list[dict[str, Any]] = field(default_factory=list)  # branch_id, tenant_id, blocks


@dataclass(frozen=True)
class SwitchOutcome:
    node_id: str
    from_phase: str
    to_phase: str
    drain_s: float
    migrate_s: float
    total_s: float
    outcome: str  # "ok" | "failed" | "noop"
    detail: str = ""


class ClusterControl(Protocol):
    async def snapshot(self) -> ClusterSnapshot: ...

    async def planner_state(self) -> dict[str, Any]:
        """{"mode", "planner", "last_decision": {...}|None, "predictions": [...]}"""

    async def set_mode(self, mode: str) -> None: ...

    async def pin_split(self, prefill_nodes: int | None) -> None:
        """Pin the number of prefill nodes (None unpins). Realised by switches."""

    async def pin_node(self, node_id: str, phase: str | None) -> None:
        """Pin one node's phase (None unpins). Switches it now if needed."""

    async def switch(self, node_id: str, to_phase: str, *, reason: str, who: str) -> SwitchOutcome: ...


class ClusterHistory(Protocol):
    async def split_history(self, since_s: float) -> list[dict[str, Any]]:
        """Samples over the last `since_s` seconds, oldest first:
        [{"t": unix_s, "prefill": int, "decode": int, "tokens_per_s": float}]"""
