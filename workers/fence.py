"""Fencing: a worker carries out control orders of the newest leadership term only.

Every gateway replica may *see* the cluster, but only the planner leader of
the current term may *steer* it. Each leadership term has a number (the
gateway's lease in the store hands out strictly increasing terms); every
switch or migrate order carries the term of the replica that sent it, and
every heartbeat or `POST /internal/fence` tells the worker the newest term
the sender knows. The worker remembers the highest term it has seen and
refuses an order whose term is lower (HTTP 409 `stale_term`): a leader that
was paused (GC, SIGSTOP, a partition) and resumes after another replica took
over cannot act any more, even before it notices that it lost its lease.

Rules (pure, over plain ints):

- `newest` starts at 0; `observe(t)` raises it to `max(newest, t)`.
- An order with term `t` is carried out iff `t >= newest` (equal terms are
  the same leader's orders); it then raises `newest` to `t`.
- An order without a term counts as term 0: accepted only while the worker
  has never seen a term (tools talking to a worker directly, without a
  gateway), refused once a leader has announced itself.

The worker keeps this in memory only: a restarted worker starts at 0 again
and learns the current term from the next heartbeat of any replica (every
`EVOLVING_HEARTBEAT_S`, 0.5 s by default). Persisting nothing is deliberate:
the term lives in the gateway's store, which is the durable copy.
"""

from __future__ import annotations

from dataclasses import dataclass


class StaleTerm(Exception):
    """An order older than the newest term this worker has seen."""

    def __init__(self, term: int, newest: int) -> None:
        super().__init__(f"order of term {term} refused: this worker has seen term {newest}")
        self.term, self.newest = term, newest


@dataclass
class TermFence:
    newest: int = 0  # highest term seen (orders, heartbeats, fence calls)
    accepted: int = 0  # orders carried out
    refused: int = 0  # orders refused as stale

    def observe(self, term: int | None) -> int:
        """Learn a term without an order (heartbeat, announcement); returns `newest`."""
        if term is not None and term > self.newest:
            self.newest = term
        return self.newest

    def admit(self, term: int | None) -> None:
        """Admit one order of `term` or raise `StaleTerm` (counted either way)."""
        t = 0 if term is None else term
        if t < self.newest:
            self.refused += 1
            raise StaleTerm(t, self.newest)
        self.newest = t
        self.accepted += 1
