"""Planner leadership: which replica's planner acts, elected through the store.

Every replica runs one `LeaderElector`. Each `renew_s` it sends one claim to
the store (`repository.claim_lease`, a conditional UPDATE on the lease row,
in a worker thread so the event loop never waits on the database) and
evaluates the answer (`gateway.control.lease`, pure):

- the leader renews; it may act until its claim's local deadline, so a
  leader that cannot reach the store stops acting on its own before any
  follower can take over;
- a follower takes the lease once it has expired, with the next term, and
  learns the current holder and term otherwise (admin API, fencing);
- `deposed()` is how a leader learns from a worker that a newer term exists
  (an order refused as stale): it stops acting at once.

Why the store and not Redis: the store is the durable part of every
deployment (SQLite for one gateway, PostgreSQL for several), so terms never
go back — a Redis without persistence that restarted would hand out term 1
again and every worker would refuse the new leader. With SQLite and one
gateway that gateway is simply the leader (its first claim wins). While the
store is unreachable no replica can confirm a lease: the planner pauses
(serving, pins and overrides are unaffected) and resumes at the first claim
that succeeds.

Hooks: `on_elected(term)` runs when this replica becomes leader (announce
the term to the workers, realise pins, decide at once); `on_deposed()` when
it stops being one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from gateway.control.lease import NO_LEASE, LeaseConfig, LeaseState, evaluate, may_act
from gateway.control.ports import LeadershipStatus
from gateway.store import repository
from gateway.store.db import Database, StoreUnavailable

log = logging.getLogger(__name__)

ElectedHook = Callable[[int], Awaitable[None]]
DeposedHook = Callable[[], Awaitable[None]]


class LeaderElector:
    def __init__(
        self,
        db: Database,
        replica: str,
        config: LeaseConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.db = db
        self.replica = replica
        self.config = config or LeaseConfig()
        self._clock = clock
        self.state: LeaseState = NO_LEASE
        self.store_reachable = True
        self.elections = 0  # times this replica became leader
        self._hooks_elected: list[ElectedHook] = []
        self._hooks_deposed: list[DeposedHook] = []
        self._was_leading = False
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._stopping = False

    def on_elected(self, hook: ElectedHook) -> None:
        self._hooks_elected.append(hook)

    def on_deposed(self, hook: DeposedHook) -> None:
        self._hooks_deposed.append(hook)

    # -- what the rest of the gateway asks --------------------------------------
    def is_leader(self) -> bool:
        """May this replica's planner act (decide, switch, realise pins) now?"""
        return may_act(self.state, self._clock())

    def order_term(self) -> int:
        """The term orders from this replica carry: its own while leading, else
        the newest it knows (an operator's manual switch through a follower is
        an order of the current term)."""
        return self.state.term

    def status(self) -> LeadershipStatus:
        return LeadershipStatus(
            replica=self.replica,
            leader=self.state.leader,
            term=self.state.term,
            leading=self.is_leader(),
            store_reachable=self.store_reachable,
        )

    def deposed(self, newer_term: int | None = None, why: str = "") -> None:
        """A worker refused an order as stale: a newer leader exists. Stop acting now."""
        if self.state.leading:
            log.warning("replica %s deposed at term %d: %s", self.replica, self.state.term, why or "newer term seen")
        term = max(self.state.term, newer_term or 0)
        self.state = LeaseState(leading=False, term=term, leader=None, held_until=0.0)
        self._wake.set()

    # -- the claim loop -----------------------------------------------------------
    async def attempt(self) -> LeaseState:
        """One claim round: renew or take over, then run the hooks of a change."""
        async with self._lock:
            held = self.state.term if self.state.leading else None
            sent_at = self._clock()
            try:
                record = await self.db.run_async(
                    lambda s: repository.claim_lease(s, holder=self.replica, ttl_s=self.config.ttl_s, held_term=held)
                )
            except StoreUnavailable:
                if self.store_reachable:
                    log.warning("store unreachable: leadership cannot be confirmed; the planner pauses")
                self.store_reachable = False
                # keep the state: `is_leader()` runs out at the last claim's deadline
            else:
                if not self.store_reachable:
                    log.info("store reachable again")
                self.store_reachable = True
                self.state = evaluate(record, self.replica, sent_at, self.config)
            await self._transitions()
            return self.state

    async def _transitions(self) -> None:
        leading = self.is_leader()
        if leading and not self._was_leading:
            self._was_leading = True
            self.elections += 1
            log.info("replica %s leads the planner at term %d", self.replica, self.state.term)
            for hook in self._hooks_elected:
                await _safely(hook(self.state.term), "on_elected")
        elif not leading and self._was_leading:
            self._was_leading = False
            log.info("replica %s no longer leads (term %d)", self.replica, self.state.term)
            for dhook in self._hooks_deposed:
                await _safely(dhook(), "on_deposed")

    async def run(self) -> None:
        """Claim every `renew_s` until `stop()`; `deposed()` wakes it early."""
        while not self._stopping:
            await self.attempt()
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.config.renew_s)

    async def start(self) -> None:
        """First claim now (a lone gateway leads before it serves), then the loop."""
        self._stopping = False
        await self.attempt()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self.run(), name="leader-elector")

    async def stop(self) -> None:
        """Stop claiming and give the lease up, so a follower takes over at once.

        The loop is let finish its claim in flight rather than cancelled: a
        cancelled claim still runs in its worker thread, and one that commits
        after the release would renew the lease it was meant to give up."""
        if self._task is not None:
            self._stopping = True
            self._wake.set()
            try:
                await asyncio.wait_for(asyncio.shield(self._task), self.config.ttl_s + 5.0)
            except TimeoutError:  # a store that hangs: the lease then lapses on its own
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
            self._task = None
        if self.state.leading:
            term = self.state.term
            self.state = LeaseState(leading=False, term=term, leader=None, held_until=0.0)
            try:
                await self.db.run_async(lambda s: repository.release_lease(s, holder=self.replica, term=term))
            except StoreUnavailable:
                log.warning("could not release the planner lease; it expires in %.1f s", self.config.ttl_s)
            await self._transitions()


async def _safely(awaitable: Awaitable[None], what: str) -> None:
    try:
        await awaitable
    except Exception:  # a failing hook must not stop the elector (it would stop renewing)
        log.exception("leadership hook %s failed", what)
