"""Planner leadership on the real store (SQLite and PostgreSQL): one holder,
takeover after expiry with a new term, release on stop, deposition by a
stale-term refusal, no leader while the store is unreachable, and no lease
held by a leader paused inside its claim."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from gateway.control.leadership import LeaderElector
from gateway.control.lease import LeaseConfig
from gateway.store import repository
from gateway.store.db import Database, StoreUnavailable

FAST = LeaseConfig(ttl_s=0.6, renew_s=0.2, drift=0.1)


async def test_one_holder_then_a_new_term_after_the_lease_runs_out(migrated_db: Database) -> None:
    a, b = LeaderElector(migrated_db, "a", FAST), LeaderElector(migrated_db, "b", FAST)
    elected: list[tuple[str, int]] = []

    async def note(name: str, term: int) -> None:
        elected.append((name, term))

    a.on_elected(lambda t: note("a", t))
    b.on_elected(lambda t: note("b", t))
    await a.attempt()
    await b.attempt()
    assert (a.is_leader(), b.is_leader()) == (True, False)
    assert (a.status().term, b.status().term, b.status().leader) == (1, 1, "a")
    await a.attempt()  # renewing keeps the term
    assert a.is_leader() and a.order_term() == 1
    await asyncio.sleep(FAST.ttl_s + 0.1)  # a stops renewing (paused, partitioned)
    assert not a.is_leader()  # its own deadline ran out before anyone could take over
    await b.attempt()
    assert b.is_leader() and b.order_term() == 2
    await a.attempt()  # a comes back: it follows, and knows the newer term
    assert not a.is_leader() and a.status().leader == "b" and a.order_term() == 2
    assert elected == [("a", 1), ("b", 2)]


async def test_a_clean_stop_hands_over_at_once(migrated_db: Database) -> None:
    a, b = LeaderElector(migrated_db, "a", FAST), LeaderElector(migrated_db, "b", FAST)
    deposed: list[str] = []

    async def gone() -> None:
        deposed.append("a")

    a.on_deposed(gone)
    await a.start()
    assert a.is_leader()
    await b.attempt()
    assert not b.is_leader()
    t = time.monotonic()
    await a.stop()
    await b.attempt()
    assert b.is_leader() and b.order_term() == 2 and time.monotonic() - t < FAST.ttl_s
    assert deposed == ["a"]
    await b.stop()


async def test_a_stale_term_refusal_deposes_at_once(migrated_db: Database) -> None:
    a = LeaderElector(migrated_db, "a", FAST)
    await a.attempt()
    assert a.is_leader()
    a.deposed(newer_term=5, why="worker w0: order of term 1 refused")
    assert not a.is_leader() and a.order_term() == 5


async def test_no_leader_while_the_store_is_unreachable() -> None:
    db = Database("postgresql+psycopg://postgres@127.0.0.1:9/none", connect_timeout_s=1.0)
    try:
        e = LeaderElector(db, "a", FAST)
        state = await e.attempt()
        assert not state.leading and not e.is_leader() and not e.status().store_reachable
    finally:
        db.dispose()


async def test_a_leader_paused_inside_its_claim_does_not_hold_the_lease(migrated_db: Database) -> None:
    """A leader stopped (SIGSTOP, a frozen VM) between its claim's UPDATE and
    its COMMIT holds the lease row's lock for as long as it is stopped. The
    claim's transaction bounds that on PostgreSQL: the server ends a session
    idle in it for a lease's TTL, and a claim waits for the lock at most as
    long; a follower then takes over as from a leader that stopped
    renewing. (SQLite takes the whole file's write lock and fails the
    waiting claim after its busy timeout instead: not run there.)"""
    if migrated_db.dialect != "postgresql":
        pytest.skip("SQLite locks the whole file; its busy timeout bounds the wait")
    a, b = LeaderElector(migrated_db, "a", FAST), LeaderElector(migrated_db, "b", FAST)
    await a.attempt()
    assert a.is_leader()
    # a's next claim, stopped after its UPDATE; its COMMIT fails once the server has ended the session
    with contextlib.suppress(StoreUnavailable), migrated_db.session() as paused:
        repository.claim_lease(paused, holder="a", ttl_s=FAST.ttl_s, held_term=1)
        await asyncio.sleep(FAST.ttl_s + 0.1)
        t = time.monotonic()
        while not b.is_leader() and time.monotonic() - t < 10 * FAST.ttl_s:
            await asyncio.wait_for(b.attempt(), 10 * FAST.ttl_s)
            await asyncio.sleep(FAST.renew_s)
        assert b.is_leader() and b.order_term() == 2
