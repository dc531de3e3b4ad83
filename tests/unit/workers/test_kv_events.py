"""KVEventChannel counts the connector's pulls and peer states per peer."""

from __future__ import annotations

from kvpool.events import PeerChanged, PullDone
from workers.kv_events import KVEventChannel
from workers.protocol import KVPeerStats


def test_pull_outcomes_and_peer_state_are_counted_per_peer() -> None:
    ch = KVEventChannel("/nonexistent.sock")
    ch.handle(PullDone("wA", "ok", 15, 0.002))
    ch.handle(PullDone("wA", "ok", 5, 0.001))
    ch.handle(PullDone("wA", "timeout", 15, 3.0))
    ch.handle(PeerChanged("wA", "down", "timeout"))
    ch.handle(PeerChanged("wA", "down", "unavailable"))  # still the same outage
    ch.handle(PullDone("wA", "skipped", 15, 0.0))
    ch.handle(PullDone("wC", "unavailable", 3, 0.1))
    assert ch.peer_stats() == [
        KVPeerStats(
            peer="wA",
            state="down",
            reason="unavailable",
            pulls={"ok": 2, "timeout": 1, "skipped": 1},
            blocks=20,
            pull_seconds=0.003,
            downs=1,
        ),
        KVPeerStats(peer="wC", pulls={"unavailable": 1}),
    ]
    ch.handle(PeerChanged("wA", "up"))
    stats = ch.peer_stats()[0]
    assert (stats.state, stats.reason, stats.downs) == ("up", "unavailable", 1)
