"""The overrides bus in one process: delivery, isolation of a broken handler, the wire form."""

from __future__ import annotations

from gateway.control.bus import ClusterEvent, LocalBus


async def test_local_bus_runs_every_handler_before_publish_returns() -> None:
    bus = LocalBus("g0", clock=lambda: 42.0)
    seen: list[ClusterEvent] = []

    async def broken(event: ClusterEvent) -> None:
        raise RuntimeError("boom")

    async def good(event: ClusterEvent) -> None:
        seen.append(event)

    bus.subscribe(broken)
    bus.subscribe(good)
    event = await bus.publish("key.revoked", {"key_id": "key_1"})
    assert seen == [event] == [ClusterEvent("key.revoked", {"key_id": "key_1"}, "g0", 42.0)]
    assert bus.delivered == 1


def test_events_round_trip_as_json() -> None:
    e = ClusterEvent("override", {"key": "split_pin", "value": None, "version": 1.5}, "host-12", 99.25)
    assert ClusterEvent.from_json(e.to_json()) == e
