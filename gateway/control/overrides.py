"""Operator overrides — planner mode, split pin, node pins — in one place.

`OverridesService` is what the admin routes call and what restores the
persisted overrides at start-up. Each change reads as validate -> apply to
the live cluster (`ClusterControl`: pins are realised by switches) ->
record (persisted override and audit row, through the buffered event sink,
so both survive a store outage).

Pins always win over the planner: the cluster runtime refuses a switch that
contradicts a node pin, and `restore` realises persisted pins before the
planner's first tick.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.control.ports import ClusterControl
from gateway.errors import GatewayError, InvalidRequest, NotFound
from gateway.store.records import NODE_PIN_PREFIX, PLANNER_MODE, SPLIT_PIN, Overrides
from planner.types import PlannerMode

log = logging.getLogger(__name__)


class OverrideRecorder(Protocol):
    """Where changes are recorded (`gateway.store.EventSink`). Never raises."""

    def record_override(self, *, key: str, value: Any, who: str) -> None: ...

    def record_audit(
        self, *, actor: str, action: str, target: str, before: Any, after: Any, actor_id: str | None = None
    ) -> None: ...

    def kick(self) -> None: ...


@dataclass(frozen=True)
class Pins:
    split: int | None  # pinned number of prefill nodes
    nodes: dict[str, str] = field(default_factory=dict)  # node_id -> pinned phase


class OverridesService:
    def __init__(self, control: ClusterControl, recorder: OverrideRecorder) -> None:
        self._control = control
        self._recorder = recorder

    async def pins(self) -> Pins:
        snap = await self._control.snapshot()
        return Pins(split=snap.split_pin, nodes={n.node_id: n.pinned_phase for n in snap.nodes if n.pinned_phase})

    async def set_mode(self, mode: str, *, who: str, actor_id: str | None = None) -> PlannerMode:
        before = (await self._control.planner_state()).mode
        await self._control.set_mode(mode)  # raises InvalidRequest
        self._record(
            who, actor_id, PLANNER_MODE, mode, "planner.mode", "planner", {"mode": before.value}, {"mode": mode}
        )
        return PlannerMode(mode)

    async def pin_split(self, prefill_nodes: int | None, *, who: str, actor_id: str | None = None) -> Pins:
        if prefill_nodes is not None:
            size = len((await self._control.snapshot()).nodes)
            if not 0 <= prefill_nodes <= size:
                raise InvalidRequest(f"prefill_nodes must be at most {size} (the cluster size).", param="prefill_nodes")
        before = await self.pins()
        await self._control.pin_split(prefill_nodes)
        self._record(
            who,
            actor_id,
            SPLIT_PIN,
            prefill_nodes,
            "pins.split" if prefill_nodes is not None else "pins.split.clear",
            "split",
            {"prefill_nodes": before.split},
            {"prefill_nodes": prefill_nodes},
        )
        return await self.pins()

    async def pin_node(self, node_id: str, phase: str | None, *, who: str, actor_id: str | None = None) -> Pins:
        if node_id not in {n.node_id for n in (await self._control.snapshot()).nodes}:
            raise NotFound(f"No node {node_id!r}.", param="node_id")
        before = (await self.pins()).nodes.get(node_id)
        await self._control.pin_node(node_id, phase)
        self._record(
            who,
            actor_id,
            NODE_PIN_PREFIX + node_id,
            phase,
            "pins.node" if phase else "pins.node.clear",
            f"node:{node_id}",
            {"phase": before},
            {"phase": phase},
        )
        return await self.pins()

    async def restore(self, overrides: Overrides, *, default_mode: str) -> None:
        """Apply the persisted mode (else `default_mode`) and pins; realise the pins now."""
        await self._control.set_mode(overrides.planner_mode or default_mode)
        if overrides.split_pin is None and not overrides.node_pins:
            return
        log.info("restoring pins: split=%s nodes=%s", overrides.split_pin, overrides.node_pins)
        try:
            await self._control.restore_pins(overrides.split_pin, dict(overrides.node_pins), who="restore")
        except GatewayError as exc:  # an unhealthy node at startup: the pin stays, realised by the next pin action
            log.warning("could not realise the persisted pins yet: %s", exc.message)

    def _record(
        self, who: str, actor_id: str | None, key: str, value: Any, action: str, target: str, before: Any, after: Any
    ) -> None:
        """`who`: the actor's name; `actor_id`: its admin token id (in the audit row)."""
        self._recorder.record_override(key=key, value=value, who=who)
        self._recorder.record_audit(
            actor=who, actor_id=actor_id, action=action, target=target, before=before, after=after
        )
        self._recorder.kick()
