"""Phase switches in the simulator, costing what they cost.

In place (ours): the node stops taking new work of its phase.
- prefill -> decode: prompts not started are re-routed; the ones computing
  finish (drain); then the role flips after `switch_overhead_s`.
- decode -> prefill: requests not admitted are re-routed; at the next
  iteration boundary every running decode is migrated: its KV (prompt +
  generated) is saved to the node's host store (d2h bandwidth) and pulled by
  the new decode node (pool bandwidth), which resumes it; the role flips when
  the save is done plus `switch_overhead_s`.
Relaunch (Dynamo-like baseline): the same drain/migrate, then the node is out
of service for `relaunch_s` before it serves in the new phase.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from core import Phase
from sim.events import EventLoop
from sim.node import NodeStatus, SimNode
from sim.state import NodeConfig, SimRequest


class SwitchHost(Protocol):
    """What a switch needs of the cluster it happens in (`sim.cluster.Cluster`)."""

    nodes: dict[str, SimNode]
    node_cfg: NodeConfig
    loop: EventLoop

    def reroute(self, sr: SimRequest) -> None: ...

    def to_decode(self, sr: SimRequest, ready_at: float) -> None: ...


@dataclass
class SwitchEvent:
    t: float
    node_id: str
    from_phase: Phase
    to_phase: Phase
    drain_s: float = 0.0
    migrate_s: float = 0.0
    total_s: float = 0.0
    migrated: int = 0


class Switcher:
    def __init__(self, cluster: SwitchHost, relaunch_s: float | None) -> None:
        self.c = cluster
        self.relaunch_s = relaunch_s
        self.events: list[SwitchEvent] = []
        self.last_switch_t: float | None = None

    def switch(self, node_id: str, to: Phase, now: float) -> bool:
        """Start switching `node_id` to `to`; False when not applicable (unknown,
        already switching or offline, or already in that phase)."""
        node = self.c.nodes.get(node_id)
        if node is None or not node.accepting or node.phase is to:
            return False
        node.close_phase_clock(now)
        node.set_status(NodeStatus.DRAINING)
        node.draining_to = to
        self.last_switch_t = now
        ev = SwitchEvent(now, node_id, node.phase, to)
        self.events.append(ev)
        if node.phase is Phase.PREFILL:
            for sr in node.prefill.take_unstarted():
                self.c.reroute(sr)
            if not node.prefill.running and not node.prefill.queue:
                self._flip(node, ev, now)
            else:
                node.prefill.on_empty = lambda t: self._prefill_drained(node, ev, t)
        else:
            pending = node.decode.drain(lambda moving, t: self._migrate(node, ev, moving, t))
            for sr in pending:
                self.c.reroute(sr)
        return True

    def _prefill_drained(self, node: SimNode, ev: SwitchEvent, t: float) -> None:
        node.prefill.on_empty = None
        ev.drain_s = t - ev.t
        self._flip(node, ev, t)

    def _migrate(self, node: SimNode, ev: SwitchEvent, moving: list[SimRequest], t: float) -> None:
        cfg = self.c.node_cfg
        ev.drain_s = t - ev.t
        save = cfg.d2h_s(sum(sr.context for sr in moving))
        ev.migrate_s, ev.migrated = save, len(moving)
        for sr in moving:
            sr.migrations += 1
            self.c.to_decode(sr, ready_at=t + save + cfg.engine_in_s + cfg.pool_s(sr.context))
        self._flip(node, ev, t + save)

    def _flip(self, node: SimNode, ev: SwitchEvent, t: float) -> None:
        if self.relaunch_s is not None:
            node.set_status(NodeStatus.OFFLINE)
            up = t + self.relaunch_s
        else:
            up = t + node.cfg.switch_overhead_s
        self.c.loop.at(up, self._up, node, ev)

    def _up(self, node: SimNode, ev: SwitchEvent) -> None:
        now = self.c.loop.now
        to = node.draining_to or node.phase
        node.set_phase(to, now)
        node.draining_to = None
        node.set_status(NodeStatus.SERVING)
        node.phase_since = now
        ev.total_s = now - ev.t
