"""Lease arithmetic of planner leadership: pure functions over plain numbers.

The lease lives in the store (`gateway.store._lease_repo`): one row with the
holder, the term and the expiry on the *database's* clock. A replica claims
it with one conditional UPDATE: it takes the row when the lease has expired
(the term goes up by one) or renews it when it still holds it with the same
term (the term stays). The store answers with who holds it, at which term,
and how long the lease has left by the database's clock.

What this module decides, locally, is how long a replica may *act* on a
claim: from the moment it **sent** the statement (monotonic clock), for the
TTL shortened by a safety margin (`drift`): the database set the expiry
later than that moment, and the two clocks run at nearly the same rate, so
the replica stops acting before any other replica can take over. Orders are
fenced by the term anyway (`workers.fence`): the margin keeps a healthy
leader from sending orders the workers would refuse, it is not what makes
stale orders harmless.

Failover after a leader dies without releasing: the lease runs out at most
`ttl_s` after its last renewal, and a follower tries every `renew_s`, so a
new leader holds it within `ttl_s + renew_s` (plus one store round trip);
it announces its term to the workers and decides at once. A leader that
stops cleanly releases the lease and a follower takes over at its next try.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.store.records import LeaseRecord


@dataclass(frozen=True)
class LeaseConfig:
    """ttl_s: how long a claim lasts without renewal (> 0).
    renew_s: renewal / takeover attempt interval (0 < renew_s <= ttl_s / 2,
        so one missed renewal does not lose the lease).
    drift: fraction of the TTL a holder gives up as margin (0 <= drift < 0.5).
    """

    ttl_s: float = 2.0
    renew_s: float = 0.5
    drift: float = 0.1

    def __post_init__(self) -> None:
        if self.ttl_s <= 0 or not 0 < self.renew_s <= self.ttl_s / 2:
            raise ValueError("need ttl_s > 0 and 0 < renew_s <= ttl_s / 2")
        if not 0 <= self.drift < 0.5:
            raise ValueError("drift must be in [0, 0.5)")

    @property
    def failover_bound_s(self) -> float:
        """Worst case from a leader's death (no release) to a new holder."""
        return self.ttl_s + self.renew_s


@dataclass(frozen=True)
class LeaseState:
    """What a replica knows after its latest claim."""

    leading: bool
    term: int  # the cluster's newest term (its own while leading)
    leader: str | None  # the holder while its lease runs, else None
    held_until: float  # monotonic deadline for acting (leading only; else 0)


NO_LEASE = LeaseState(leading=False, term=0, leader=None, held_until=0.0)


def evaluate(record: LeaseRecord, me: str, sent_at: float, config: LeaseConfig) -> LeaseState:
    """The state after a claim that was sent at `sent_at` (monotonic s) and
    returned `record`."""
    alive = record.expires_in_s > 0
    leading = alive and record.holder == me
    held_until = sent_at + config.ttl_s * (1.0 - config.drift) if leading else 0.0
    return LeaseState(leading, record.term, record.holder if alive else None, held_until)


def may_act(state: LeaseState, now: float) -> bool:
    """May the replica send orders now (monotonic `now`)?"""
    return state.leading and now < state.held_until


def newer_term(term: int, seen: int) -> bool:
    """Does `term` supersede `seen`? (Terms only grow; equal is the same leader.)"""
    return term > seen
