"""Operator overrides — planner mode, split pin, node pins — in one place.

`OverridesService` is what the admin routes call, what restores the
persisted overrides at start-up, and what applies changes made through the
other replicas. Each change reads as validate -> apply to the live cluster
(`ClusterControl`; pins are realised by switches on the leader) -> record
(persisted override and audit row, through the buffered event sink, so both
survive a store outage) -> publish on the overrides bus (`gateway.control.bus`).

Versions: every change of an override key (`planner_mode`, `split_pin`,
`node_pin:<id>`) carries its version, the unix time of the change. A replica
applies a value only if its version is newer than the one it holds, whether
it comes from the bus (within milliseconds) or from `reconcile` (the store,
every `EVOLVING_RECONCILE_S`, healing a missed message). A store write that
is still in the origin's sink buffer therefore never reverts a newer value
a replica already has. Clearing a pin stores a tombstone (value null) with
its version, so a clear propagates like a set.

Pins always win over the planner: the cluster runtime refuses a switch that
contradicts a node pin, and the leader realises pins as soon as it learns of
them (and at election, before its first decision).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from core import Phase
from gateway.control.bus import BusEvent, ClusterEvent, OverrideChanged
from gateway.control.ports import ClusterControl
from gateway.http.errors import GatewayError, InvalidRequest, NotFound
from gateway.store.records import NODE_PIN_PREFIX, PLANNER_MODE, SPLIT_PIN, Overrides
from planner.types import PlannerMode

log = logging.getLogger(__name__)


class OverrideRecorder(Protocol):
    """Where changes are recorded (`gateway.store.EventSink`). Never raises."""

    def record_override(self, *, key: str, value: Any, who: str, t: float | None = None) -> None: ...

    def record_audit(
        self, *, actor: str, action: str, target: str, before: Any, after: Any, actor_id: str | None = None
    ) -> None: ...

    def kick(self) -> None: ...


class Publisher(Protocol):
    """The overrides bus as this service uses it (`LocalBus`, `RedisBus`)."""

    async def publish(self, published: BusEvent) -> ClusterEvent: ...


@dataclass(frozen=True)
class Pins:
    split: int | None  # pinned number of prefill nodes
    nodes: dict[str, Phase] = field(default_factory=dict)  # node_id -> pinned phase


class OverridesService:
    def __init__(
        self,
        control: ClusterControl,
        recorder: OverrideRecorder,
        *,
        bus: Publisher | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._control = control
        self._recorder = recorder
        self._bus = bus
        self._clock = clock
        self.versions: dict[str, float] = {}  # override key -> version applied here
        self._apply_lock = asyncio.Lock()
        self._default_mode = PlannerMode.ADVISORY.value

    async def pins(self) -> Pins:
        snap = await self._control.snapshot()
        return Pins(split=snap.split_pin, nodes={n.node_id: n.pinned_phase for n in snap.nodes if n.pinned_phase})

    # -- admin writes -------------------------------------------------------------
    async def set_mode(self, mode: str, *, who: str, actor_id: str | None = None) -> PlannerMode:
        before = (await self._control.planner_state()).mode
        await self._control.set_mode(mode)  # raises InvalidRequest
        await self._record(
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
        await self._record(
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

    async def pin_node(self, node_id: str, phase: Phase | None, *, who: str, actor_id: str | None = None) -> Pins:
        if node_id not in {n.node_id for n in (await self._control.snapshot()).nodes}:
            raise NotFound(f"No node {node_id!r}.", param="node_id")
        before = (await self.pins()).nodes.get(node_id)
        await self._control.pin_node(node_id, phase)
        await self._record(
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

    async def _record(
        self, who: str, actor_id: str | None, key: str, value: Any, action: str, target: str, before: Any, after: Any
    ) -> None:
        """`who`: the actor's name; `actor_id`: its admin token id (in the audit row).
        Stored and published with a version that only grows per key."""
        version = max(self._clock(), self.versions.get(key, 0.0) + 1e-6)
        self.versions[key] = version
        self._recorder.record_override(key=key, value=value, who=who, t=version)
        self._recorder.record_audit(
            actor=who, actor_id=actor_id, action=action, target=target, before=before, after=after
        )
        self._recorder.kick()
        if self._bus is not None:
            await self._bus.publish(OverrideChanged(key, value, version))

    # -- start-up, other replicas, reconciliation ---------------------------------------
    async def restore(self, overrides: Overrides, *, default_mode: str) -> None:
        """Apply the persisted mode (else `default_mode`) and pins; the leader realises the pins."""
        self._default_mode = default_mode
        self.versions.update(overrides.versions)
        await self._control.set_mode(overrides.planner_mode or default_mode)
        if overrides.split_pin is None and not overrides.node_pins:
            return
        log.info("restoring pins: split=%s nodes=%s", overrides.split_pin, overrides.node_pins)
        try:
            pins = {node: Phase(phase) for node, phase in overrides.node_pins.items()}
            await self._control.restore_pins(overrides.split_pin, pins, who="restore")
        except GatewayError as exc:  # an unhealthy node at startup: the pin stays, realised by the next pin action
            log.warning("could not realise the persisted pins yet: %s", exc.message)

    async def on_event(self, event: ClusterEvent) -> None:
        """Bus handler: a change made through another replica."""
        if event.kind != OverrideChanged.KIND:
            return
        change = event.payload()
        if not isinstance(change, OverrideChanged):
            log.warning("malformed override event from %s ignored", event.origin)
            return
        key, value, version = change.key, change.value, float(change.version)
        # In the background: realising a pin on the leader waits for switches;
        # the bus keeps delivering meanwhile (versions keep the order right).
        asyncio.get_running_loop().create_task(self.apply(key, value, version), name=f"override-{key}")

    async def reconcile(self, stored: Overrides) -> int:
        """Apply every stored override newer than what this replica holds; returns how many."""
        applied = 0
        for key, version in sorted(stored.versions.items(), key=lambda kv: kv[1]):
            if key == PLANNER_MODE:
                value: Any = stored.planner_mode
            elif key == SPLIT_PIN:
                value = stored.split_pin
            elif key.startswith(NODE_PIN_PREFIX):
                value = stored.node_pins.get(key[len(NODE_PIN_PREFIX) :])
            else:
                continue
            applied += await self.apply(key, value, version)
        return applied

    async def apply(self, key: str, value: Any, version: float) -> bool:
        """Apply one override if `version` is newer than the one held here."""
        async with self._apply_lock:
            if version <= self.versions.get(key, float("-inf")):
                return False
            self.versions[key] = version
            try:
                if key == PLANNER_MODE:
                    await self._control.set_mode(str(value) if value is not None else self._default_mode)
                elif key == SPLIT_PIN:
                    await self._control.pin_split(None if value is None else int(value))
                elif key.startswith(NODE_PIN_PREFIX):
                    await self._control.pin_node(key[len(NODE_PIN_PREFIX) :], None if value is None else Phase(value))
                else:
                    return False
            except GatewayError as exc:  # e.g. a node this replica does not know: kept as versioned, logged
                log.warning("override %s=%r not applied here: %s", key, value, exc.message)
                return False
            log.info("override %s=%r applied (version %.3f)", key, value, version)
            return True
