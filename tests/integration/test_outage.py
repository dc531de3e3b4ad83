"""Store outage: serving continues and no event is lost.

The PostgreSQL test makes its database refuse connections
(`ALLOW_CONNECTIONS false` + terminating its backends) while the gateway
keeps authenticating, admitting and recording decisions, switch events,
usage, audit entries and overrides; then restores access and checks every
row arrives exactly once. SQLite tests cover the sink's bound and its
handling of rows the database rejects.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest
from fastapi import FastAPI

from core import Phase
from gateway.admin import bootstrap_admin_token, build_admin_router
from gateway.http.error_responses import install_error_handlers
from gateway.serving.policy import StoreTenantGate
from gateway.store import Database, EventSink, Policy, SinkConfig, repository
from gateway.store.migrate import db_upgrade
from gateway.store.records import SwitchOutcome, UsageRecord
from gateway.store.tables import AuditEntry, Override, PlannerDecision, SwitchEvent
from planner.types import Decision
from testing.fake_cluster import FakeClusterControl
from testing.stores import PG_URL, pg_admin, pg_database
from testing.waiting import wait_for

FAST = SinkConfig(flush_interval_s=0.05, retry_initial_s=0.05, retry_max_s=0.2)


def decision(t: float) -> Decision:
    return Decision(
        t=t,
        planner="online",
        current_split=(2, 2),
        chosen_split=(1, 3),
        actions=(),
        acted=False,
        reason="advisory",
        confidence=0.9,
    )


@pytest.fixture
def pg_db() -> Iterator[tuple[Database, str]]:
    with pg_database() as name:
        url = PG_URL.format(host="127.0.0.1", port=5432, name=name)
        db_upgrade(url)
        db = Database(url, pepper="p", connect_timeout_s=1)
        try:
            yield db, name
        finally:
            db.dispose()


def cut(name: str) -> None:
    pg_admin(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
    pg_admin(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'")


def restore(name: str) -> None:
    pg_admin(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')


@pytest.mark.postgres
async def test_outage_keeps_serving_and_loses_nothing(pg_db: tuple[Database, str]) -> None:
    db, name = pg_db
    with db.session() as s:
        for tid in ("a", "b"):
            repository.create_tenant(s, name=tid, tenant_id=tid, policy=Policy(requests_per_minute=1000))
        _, key_a = repository.create_api_key(s, tenant_id="a", pepper=db.pepper)
    token = bootstrap_admin_token(db, None)
    sink = EventSink(db, config=FAST)
    gate = StoreTenantGate(db, sink)
    await gate.start()
    sink.start()
    control = FakeClusterControl()
    app = FastAPI()
    app.include_router(build_admin_router(control=control, db=db, sink=sink))
    install_error_handlers(app)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://admin")
    op = {"Authorization": f"Bearer {token}"}
    assert (await client.get("/admin/whoami", headers=op)).status_code == 200  # caches the admin token

    cut(name)
    try:
        assert not await gate.refresh()
        tenant = await gate.authenticate(key_a)  # cached keys and policies keep serving
        for i in range(50):
            async with gate.admit(tenant, model="m", prompt_tokens=10, max_tokens=5):
                pass
            gate.record_usage(UsageRecord("a" if i % 2 else "b", "m", 10, 4, 5))
        t0 = time.time()
        for i in range(40):
            sink.record_decision(decision(t0 + i), "advisory")
            sink.record_switch(
                SwitchOutcome(f"n{i % 3}", Phase.PREFILL, Phase.DECODE, 1, 1, 2, "ok"), "planner", "planner"
            )
        sink.record_usage(UsageRecord("a", "m", 1, 0, 1), t=t0 - 120)  # an older minute
        # Control actions still work; their audit and persisted pin wait in the buffer.
        r = await client.post("/admin/switch", json={"node_id": "n0", "to_phase": "decode"}, headers=op)
        assert r.status_code == 200
        assert (await client.put("/admin/pins/split", json={"prefill_nodes": 1}, headers=op)).status_code == 200
        r = await client.get("/admin/tenants", headers=op)  # store-backed reads say so
        assert r.status_code == 503 and r.json()["error"]["code"] == "store_unavailable"
        await wait_for(lambda: sink.stats.failed_flushes >= 2)
        assert sink.stats.pending_events == 40 * 2 + 3
    finally:
        restore(name)

    await wait_for(lambda: sink.stats.pending_events == 0 and sink.stats.pending_usage_rows == 0)
    await sink.stop()
    await gate.stop()
    await client.aclose()
    with db.session() as s:
        assert s.query(PlannerDecision).count() == 40
        assert s.query(SwitchEvent).count() == 40
        assert {a.action for a in s.query(AuditEntry)} >= {"switch", "pins.split", "admin_token.bootstrap"}
        pin = s.get(Override, repository.SPLIT_PIN)
        assert pin is not None and pin.value == 1
        usage_a = repository.list_usage(s, tenant_id="a")
        usage_b = repository.list_usage(s, tenant_id="b")
    assert sum(r.requests for r in usage_a) == 26 and len(usage_a) >= 2
    assert sum(r.requests for r in usage_b) == 25
    assert sum(r.prompt_tokens for r in usage_b) == 250 and sum(r.cached_tokens for r in usage_b) == 100
    assert sink.stats.dropped == 0 and sink.stats.rejected == 0


async def test_sink_bound_drops_oldest_and_counts(sqlite_db: Database) -> None:
    sink = EventSink(sqlite_db, config=SinkConfig(max_buffered=5, max_batch=2))
    for i in range(8):
        sink.record_decision(decision(float(i)), "auto")
    assert sink.stats.dropped == 3 and sink.stats.pending_events == 5
    assert await sink.flush_all()
    with sqlite_db.session() as s:
        rows, total = repository.list_decisions(s)
    assert total == 5 and sorted(r.t for r in rows) == [3.0, 4.0, 5.0, 6.0, 7.0]


async def test_rejected_row_does_not_block_the_rest(sqlite_db: Database) -> None:
    sink = EventSink(sqlite_db)
    sink.record_audit(actor="a", action="ok.1", target="x")
    sink.record_decision(object(), "auto")  # type: ignore[arg-type]  # a malformed event
    sink.record_audit(actor="a", action="ok.2", target="x")
    assert await sink.flush()
    assert sink.stats.rejected == 1 and sink.stats.pending_events == 0
    with sqlite_db.session() as s:
        assert repository.list_audit(s)[1] == 2


async def test_stop_flushes_what_is_buffered(sqlite_db: Database) -> None:
    sink = EventSink(sqlite_db, config=SinkConfig(flush_interval_s=60))
    sink.start()
    sink.record_switch(SwitchOutcome("n", Phase.DECODE, Phase.PREFILL, 0, 0, 0, "noop"), "manual", "alice", t=5.0)
    sink.record_override(key=repository.PLANNER_MODE, value="manual", who="alice")
    await sink.stop()
    with sqlite_db.session() as s:
        assert repository.list_switch_events(s)[1] == 1
        assert repository.get_overrides(s).planner_mode == "manual"


async def test_writer_writes_once_per_interval_under_steady_traffic(sqlite_db: Database) -> None:
    """Usage recorded every millisecond: the writer takes what is buffered
    each interval and waits, instead of chasing an empty buffer (which wrote
    one transaction per request and cost the hot path its CPU)."""
    sink = EventSink(sqlite_db, config=SinkConfig(flush_interval_s=0.2))
    writes = 0
    real_write = sink._write

    def counting_write(batch, usage):
        nonlocal writes
        writes += 1
        return real_write(batch, usage)

    # Wraps the sink's write to count the batches it takes.
    sink._write = counting_write  # type: ignore[method-assign]
    sink.start()
    start = time.monotonic()
    sent = 0
    while time.monotonic() - start < 1.2:
        sink.record_usage(UsageRecord("a", "m", 10, 0, 1))
        sink.record_decision(decision(float(sent)), "auto")
        sent += 1
        await asyncio.sleep(0.001)
    await sink.stop()
    # ~6 intervals plus the final flush; the bound that matters is the upper one (one write a
    # request would be ~1,000). At least one interval's write besides the final flush, even
    # when a loaded machine stalls the writer's fsync for a few intervals (seen once: 2).
    assert 2 <= writes <= 9, writes
    with sqlite_db.session() as s:
        assert sum(r.requests for r in repository.list_usage(s, tenant_id="a")) == sent
        assert repository.list_decisions(s)[1] == sent
