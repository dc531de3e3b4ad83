"""OverridesService over the in-memory cluster: validate -> apply -> record, and restore."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.control.overrides import OverridesService, Pins
from gateway.errors import InvalidRequest, NotFound, Unavailable
from gateway.store.records import Overrides, SwitchOutcome
from planner.types import PlannerMode
from testing.fake_cluster import FakeClusterControl


class Recorder:
    """The OverrideRecorder port, collecting every call in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.actor_ids: list[str | None] = []  # of the audit calls, in order

    def record_override(self, *, key: str, value: Any, who: str) -> None:
        self.calls.append(("override", key, value, who))

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

    async def restore_pins(self, split_pin: int | None, node_pins: dict[str, str], *, who: str) -> list[SwitchOutcome]:
        self.calls.append(("restore_pins", split_pin, node_pins, who))
        if self.restore_error is not None:
            raise self.restore_error
        return await super().restore_pins(split_pin, node_pins, who=who)


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
    await svc.pin_node("n0", "decode", who="bob", actor_id="adm_2")
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
        await svc.pin_node("zz", "decode", who="ops")
    assert (exc.value.param, exc.value.code) == ("node_id", "not_found")
    assert (control.node_pins, rec.calls) == ({}, [])


async def test_pin_node_then_clear() -> None:
    svc, control, rec = _service()
    assert await svc.pin_node("n0", "decode", who="ops") == Pins(split=None, nodes={"n0": "decode"})
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
