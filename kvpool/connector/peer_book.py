"""Which peers a node pulls from, and when to try a failed one again (pure).

A pull that fails (timeout, disconnect, refused) marks its peer DOWN: later
loads skip it at once and recompute, instead of each waiting out a deadline.
The worker side's recovery loop asks `due()` which DOWN peers to try again;
a try is: wait until no timed-out read to the peer is in flight, fetch its
agent info (a restarted peer has a new NIXL agent), add it to the transport
afresh, probe it. Success -> UP; failure -> DOWN again, the next try after a
doubled wait (`Backoff`). Nothing here does I/O or reads a clock.

    UP --failed--> DOWN --reconnected--> UP
                   DOWN --retry_failed--> DOWN (backoff doubled)
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class PeerState(str, Enum):
    UP = "up"
    DOWN = "down"


PEER_TRANSITIONS: dict[PeerState, frozenset[PeerState]] = {
    PeerState.UP: frozenset({PeerState.DOWN}),
    PeerState.DOWN: frozenset({PeerState.UP, PeerState.DOWN}),
}


@dataclass(frozen=True)
class Backoff:
    first_s: float = 0.5  # wait before the first try after a failure (> 0)
    max_s: float = 10.0  # longest wait between tries (>= first_s)
    factor: float = 2.0  # growth per failed try (>= 1)

    def __post_init__(self) -> None:
        if self.first_s <= 0 or self.max_s < self.first_s or self.factor < 1:
            raise ValueError(f"invalid Backoff {self}")

    def wait_s(self, tries: int) -> float:
        """Wait before try number `tries` + 1 (0 tries so far: first_s)."""
        return float(min(self.max_s, self.first_s * self.factor**tries))


@dataclass
class PeerRecord:
    node_id: str
    state: PeerState = PeerState.UP
    reason: str = ""  # why it went down (the last failure)
    down_since: float | None = None  # clock time it went down
    tries: int = 0  # failed reconnection tries since it went down
    next_try: float = 0.0  # clock time of the next try (DOWN only)
    downs: int = 0  # times it went down
    reconnects: int = 0  # times it came back


class InvalidPeerTransition(ValueError):
    """A peer event that its state does not allow."""


class PeerBook:
    def __init__(self, backoff: Backoff | None = None) -> None:
        self.backoff = backoff or Backoff()
        self._peers: dict[str, PeerRecord] = {}

    def record(self, node_id: str) -> PeerRecord:
        rec = self._peers.get(node_id)
        if rec is None:
            rec = self._peers[node_id] = PeerRecord(node_id)
        return rec

    def usable(self, node_id: str) -> bool:
        """Pull from it now? Unknown peers are tried."""
        rec = self._peers.get(node_id)
        return rec is None or rec.state is PeerState.UP

    def failed(self, node_id: str, now: float, reason: str) -> bool:
        """A pull failed. Returns True when this took the peer down (False:
        it was down already, e.g. two loads failing together)."""
        rec = self.record(node_id)
        if rec.state is PeerState.DOWN:
            rec.reason = reason
            return False
        self._move(rec, PeerState.DOWN)
        rec.reason, rec.down_since, rec.tries = reason, now, 0
        rec.next_try = now + self.backoff.wait_s(0)
        rec.downs += 1
        return True

    def due(self, now: float) -> list[str]:
        """DOWN peers whose next try has come, longest waiting first."""
        down = [r for r in self._peers.values() if r.state is PeerState.DOWN and r.next_try <= now]
        return [r.node_id for r in sorted(down, key=lambda r: (r.next_try, r.node_id))]

    def postpone(self, node_id: str, now: float, wait_s: float) -> None:
        """Not ready to try yet (reads to it still in flight): look again soon."""
        rec = self.record(node_id)
        if rec.state is PeerState.DOWN:
            rec.next_try = now + wait_s

    def retry_failed(self, node_id: str, now: float, reason: str) -> None:
        rec = self.record(node_id)
        self._move(rec, PeerState.DOWN)
        rec.tries += 1
        rec.reason = reason
        rec.next_try = now + self.backoff.wait_s(rec.tries)

    def reconnected(self, node_id: str, now: float) -> float:
        """The peer answered again; returns how long it was down (s)."""
        rec = self.record(node_id)
        self._move(rec, PeerState.UP)
        down_for = now - (rec.down_since if rec.down_since is not None else now)
        rec.down_since, rec.tries, rec.next_try = None, 0, 0.0
        rec.reconnects += 1
        return down_for

    def records(self) -> list[PeerRecord]:
        return [self._peers[n] for n in sorted(self._peers)]

    @staticmethod
    def _move(rec: PeerRecord, to: PeerState) -> None:
        if to not in PEER_TRANSITIONS[rec.state]:
            raise InvalidPeerTransition(f"peer {rec.node_id}: {rec.state.value} -> {to.value}")
        rec.state = to
