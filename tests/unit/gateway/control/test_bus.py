"""The overrides bus in one process: delivery, isolation of a broken handler, the wire form."""

from __future__ import annotations

from gateway.control.bus import AdminTokenRevoked, ClusterEvent, KeyRevoked, LocalBus, OverrideChanged, TenantChanged


async def test_local_bus_runs_every_handler_before_publish_returns() -> None:
    bus = LocalBus("g0", clock=lambda: 42.0)
    seen: list[ClusterEvent] = []

    async def broken(event: ClusterEvent) -> None:
        raise RuntimeError("boom")

    async def good(event: ClusterEvent) -> None:
        seen.append(event)

    bus.subscribe(broken)
    bus.subscribe(good)
    event = await bus.publish(KeyRevoked("key_1", "t1"))
    assert seen == [event] == [ClusterEvent("key.revoked", {"key_id": "key_1", "tenant_id": "t1"}, "g0", 42.0)]
    assert bus.delivered == 1


def test_events_round_trip_as_json() -> None:
    e = ClusterEvent("override", {"key": "split_pin", "value": None, "version": 1.5}, "host-12", 99.25)
    assert ClusterEvent.from_json(e.to_json()) == e
    assert e.payload() == OverrideChanged("split_pin", None, 1.5)


def test_each_typed_event_travels_as_its_kind_and_fields_and_comes_back() -> None:
    for typed in (
        KeyRevoked("k", "t"),
        TenantChanged("t", deleted=True),
        AdminTokenRevoked("a"),
        OverrideChanged("m", "auto", 2.0),
    ):
        wire = ClusterEvent.from_json(ClusterEvent.of(typed, "g1", 1.0).to_json())
        assert wire.kind == typed.KIND
        assert wire.payload() == typed


def test_an_unknown_kind_or_malformed_fields_give_no_payload() -> None:
    assert ClusterEvent("from.a.newer.replica", {"x": 1}).payload() is None
    assert ClusterEvent("override", {"key": "planner_mode"}).payload() is None  # no version
