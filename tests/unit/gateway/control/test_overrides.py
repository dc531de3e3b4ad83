"""OverridesService over the in-memory cluster: validate -> apply -> record, and restore."""

from __future__ import annotations

from typing import Any

import pytest

from core import Phase
from gateway.control.bus import BusEvent, OverrideChanged
from gateway.control.overrides import OverridesService, Pins
from gateway.http.errors import InvalidRequest, NotFound, Unavailable
from gateway.store.records import Overrides, SwitchOutcome
from planner.types import PlannerMode
from testing.fake_cluster import FakeClusterControl


class Recorder:
    """The OverrideRecorder port, collecting every call in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.versions: list[float | None] = []
        self.actor_ids: list[str | None] = []  # of the audit calls, in order

    def record_override(self, *, key: str, value: Any, who: str, t: float | None = None) -> None:
        self.calls.append(("override", key, value, who))
        self.versions.append(t)

    def record_audit(
        self, *, actor: str, action: str, target: str, before: Any, after: Any, actor_id: str | None = None
    ) -> None:
        self.calls.append(("audit", actor, action, target, before, after))
        self.actor_ids.append(actor_id)

    def kick(self) -> None:
        self.calls.append(("kick",))


class StrictControl(FakeClusterControl):
    """The fake cluster (nodes n0 prefill, n1 decode) refusing modes like the real runtime, recording restores."""

    restore_error: Exception | None = None

    async def set_mode(self, mode: str) -> None:
        if mode not in ("auto", "advisory", "manual"):
            raise InvalidRequest(f"mode must be one of auto/advisory/manual, not {mode!r}", param="mode")
        await super().set_mode(mode)

    async def restore_pins(
        self, split_pin: int | None, node_pins: dict[str, Phase], *, who: str
    ) -> list[SwitchOutcome]:
        self.calls.append(("restore_pins", split_pin, node_pins, who))
        if self.restore_error is not None:
            raise self.restore_error
        return await super().restore_pins(split_pin, node_pins, who=who)


def _split_pin(control: FakeClusterControl) -> int | None:
    """Read through a call: after `control.split_pin == 1` mypy would take it for an int."""
    return control.split_pin


def _service() -> tuple[OverridesService, StrictControl, Recorder]:
    control, recorder = StrictControl(), Recorder()
    return OverridesService(control, recorder), control, recorder


async def test_set_mode_records_the_override_and_an_audit_row() -> None:
    svc, control, rec = _service()
    assert await svc.set_mode("manual", who="alice") is PlannerMode.MANUAL
    assert control.mode == "manual"
    assert rec.calls == [
        ("override", "planner_mode", "manual", "alice"),
        ("audit", "alice", "planner.mode", "planner", {"mode": "auto"}, {"mode": "manual"}),
        ("kick",),
    ]


async def test_audit_rows_carry_the_actor_token_id() -> None:
    svc, _, rec = _service()
    await svc.set_mode("manual", who="alice", actor_id="adm_1")
    await svc.pin_split(1, who="alice", actor_id="adm_1")
    await svc.pin_node("n0", Phase.DECODE, who="bob", actor_id="adm_2")
    await svc.pin_node("n0", None, who="bob")
    assert rec.actor_ids == ["adm_1", "adm_1", "adm_2", None]


async def test_an_unknown_mode_is_refused_and_not_recorded() -> None:
    svc, control, rec = _service()
    with pytest.raises(InvalidRequest) as exc:
        await svc.set_mode("chaos", who="alice")
    assert exc.value.param == "mode"
    assert (control.mode, rec.calls) == ("auto", [])


@pytest.mark.parametrize("prefill_nodes", [3, -1])
async def test_pin_split_out_of_range_is_refused_and_not_recorded(prefill_nodes: int) -> None:
    svc, control, rec = _service()
    with pytest.raises(InvalidRequest) as exc:
        await svc.pin_split(prefill_nodes, who="ops")
    assert (exc.value.param, exc.value.status) == ("prefill_nodes", 400)
    assert (control.split_pin, rec.calls) == (None, [])


async def test_pin_split_then_clear() -> None:
    svc, control, rec = _service()
    assert await svc.pin_split(2, who="ops") == Pins(split=2, nodes={})
    assert await svc.pin_split(None, who="ops") == Pins(split=None, nodes={})
    assert rec.calls == [
        ("override", "split_pin", 2, "ops"),
        ("audit", "ops", "pins.split", "split", {"prefill_nodes": None}, {"prefill_nodes": 2}),
        ("kick",),
        ("override", "split_pin", None, "ops"),
        ("audit", "ops", "pins.split.clear", "split", {"prefill_nodes": 2}, {"prefill_nodes": None}),
        ("kick",),
    ]


async def test_pin_node_of_an_unknown_node_is_not_found() -> None:
    svc, control, rec = _service()
    with pytest.raises(NotFound) as exc:
        await svc.pin_node("zz", Phase.DECODE, who="ops")
    assert (exc.value.param, exc.value.code) == ("node_id", "not_found")
    assert (control.node_pins, rec.calls) == ({}, [])


async def test_pin_node_then_clear() -> None:
    svc, control, rec = _service()
    assert await svc.pin_node("n0", Phase.DECODE, who="ops") == Pins(split=None, nodes={"n0": Phase.DECODE})
    assert await svc.pin_node("n0", None, who="ops") == Pins(split=None, nodes={})
    assert rec.calls == [
        ("override", "node_pin:n0", "decode", "ops"),
        ("audit", "ops", "pins.node", "node:n0", {"phase": None}, {"phase": "decode"}),
        ("kick",),
        ("override", "node_pin:n0", None, "ops"),
        ("audit", "ops", "pins.node.clear", "node:n0", {"phase": "decode"}, {"phase": None}),
        ("kick",),
    ]


async def test_restore_applies_the_persisted_mode_and_pins() -> None:
    svc, control, rec = _service()
    saved = Overrides(split_pin=1, node_pins={"n1": "prefill"}, planner_mode="advisory")
    await svc.restore(saved, default_mode="auto")
    assert (control.mode, control.split_pin, control.node_pins) == ("advisory", 1, {"n1": "prefill"})
    assert control.calls == [("restore_pins", 1, {"n1": "prefill"}, "restore")]
    assert rec.calls == []  # restoring is not a change


async def test_restore_without_overrides_applies_the_default_mode_only() -> None:
    svc, control, rec = _service()
    await svc.restore(Overrides(), default_mode="manual")
    assert (control.mode, control.split_pin, control.node_pins) == ("manual", None, {})
    assert (control.calls, rec.calls) == ([], [])


async def test_restore_keeps_going_when_the_pins_cannot_be_realised_yet() -> None:
    svc, control, _ = _service()
    control.restore_error = Unavailable("node n1 is unhealthy")
    await svc.restore(Overrides(split_pin=1), default_mode="auto")
    assert control.calls == [("restore_pins", 1, {}, "restore")]


# -- versions: changes from other replicas and from the store ---------------------------


class Bus:
    """The Publisher port, collecting events."""

    def __init__(self) -> None:
        self.events: list[BusEvent] = []

    async def publish(self, published: BusEvent) -> Any:
        self.events.append(published)


async def test_every_change_is_published_with_the_version_it_was_recorded_at() -> None:
    control, rec, bus = StrictControl(), Recorder(), Bus()
    ticks = iter([100.0, 100.0, 250.0])
    svc = OverridesService(control, rec, bus=bus, clock=lambda: next(ticks))
    await svc.set_mode("manual", who="a")
    await svc.set_mode("auto", who="a")  # same clock reading: the version still grows
    await svc.pin_node("n0", Phase.DECODE, who="a")
    changes = [e for e in bus.events if isinstance(e, OverrideChanged)]
    assert len(changes) == len(bus.events)
    assert [(c.key, c.value) for c in changes] == [
        ("planner_mode", "manual"),
        ("planner_mode", "auto"),
        ("node_pin:n0", "decode"),
    ]
    assert [c.version for c in changes] == [100.0, pytest.approx(100.000001), 250.0]
    assert rec.versions == [100.0, pytest.approx(100.000001), 250.0]


async def test_apply_takes_only_newer_versions() -> None:
    svc, control, rec = _service()
    assert await svc.apply("planner_mode", "manual", 10.0)
    assert not await svc.apply("planner_mode", "auto", 9.0)  # an older change arriving late
    assert not await svc.apply("planner_mode", "auto", 10.0)  # the same one twice
    assert control.mode == "manual"
    assert await svc.apply("split_pin", 1, 11.0) and control.split_pin == 1
    assert await svc.apply("split_pin", None, 12.0)
    assert _split_pin(control) is None  # a clear is a change too
    assert await svc.apply("node_pin:n1", "prefill", 13.0) and control.node_pins == {"n1": "prefill"}
    assert not await svc.apply("bogus", 1, 14.0)
    assert rec.calls == []  # applying another replica's change records nothing here


async def test_reconcile_heals_a_missed_change_and_never_reverts_a_newer_one() -> None:
    svc, control, _ = _service()
    await svc.apply("planner_mode", "manual", 50.0)  # from the bus, newer than the store's copy
    stored = Overrides(
        split_pin=2,
        node_pins={"n0": "decode"},
        planner_mode="auto",
        versions={"planner_mode": 40.0, "split_pin": 45.0, "node_pin:n0": 46.0, "node_pin:n1": 47.0},
    )
    assert await svc.reconcile(stored) == 3  # split pin, n0's pin and n1's clear (a tombstone)
    assert (control.mode, control.split_pin, control.node_pins) == ("manual", 2, {"n0": "decode"})
    assert await svc.reconcile(stored) == 0


async def test_a_bus_event_is_applied_in_the_background() -> None:
    import asyncio

    from gateway.control.bus import ClusterEvent

    svc, control, _ = _service()
    await svc.on_event(ClusterEvent("override", {"key": "planner_mode", "value": "manual", "version": 5.0}, "g2"))
    await svc.on_event(ClusterEvent("override", {"key": "planner_mode"}, "g2"))  # malformed: ignored
    await svc.on_event(ClusterEvent("key.revoked", {"key_id": "k"}, "g2"))  # not an override
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert control.mode == "manual" and svc.versions["planner_mode"] == 5.0
