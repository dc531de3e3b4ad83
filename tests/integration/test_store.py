"""Store integration tests on SQLite and PostgreSQL: migrations up/down and
every repository function against the real database."""

from __future__ import annotations

import dataclasses
import math
import os
import pathlib
import subprocess
import sys
import time

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from core import Phase
from gateway.http import errors
from gateway.store import Database, Policy, repository
from gateway.store.credentials import TENANT_KEY_PREFIX, verify_secret
from gateway.store.migrate import MIGRATION_LOCK_KEY, db_downgrade, db_revision, db_upgrade
from gateway.store.records import SwitchOutcome
from gateway.store.tables import Base
from planner.types import Decision, SplitPrediction, SwitchAction
from testing.stores import PG_URL, pg_database

ROOT = pathlib.Path(__file__).resolve().parents[2]
HEAD = "0004"  # the newest migration

STORE_TABLES = {
    "tenants",
    "api_keys",
    "tenant_policies",
    "planner_decisions",
    "switch_events",
    "overrides",
    "audit_log",
    "usage_minutes",
    "admin_tokens",
}


def _tables(url: str) -> set[str]:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_migrations_up_down_and_match_models(store_url: str) -> None:
    assert db_revision(store_url) is None
    db_upgrade(store_url)
    assert db_revision(store_url) == HEAD
    assert _tables(store_url) >= STORE_TABLES
    engine = sa.create_engine(store_url, poolclass=sa.pool.NullPool)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
    engine.dispose()
    assert diff == []
    db_downgrade(store_url, "base")
    assert db_revision(store_url) is None
    assert not (STORE_TABLES & _tables(store_url))
    db_upgrade(store_url)  # and up again
    assert db_revision(store_url) == HEAD


def test_migration_0002_renames_active_duplicate_token_names_then_holds_them_unique(store_url: str) -> None:
    db_upgrade(store_url, "0001")
    engine = sa.create_engine(store_url, poolclass=sa.pool.NullPool)
    rows = [
        ("adm_a", "ci", "viewer", 1.0, None),
        ("adm_b", "ci", "viewer", 2.0, None),  # an active duplicate: renamed
        ("adm_c", "ci", "viewer", 3.0, 5.0),  # revoked: kept as it is
        ("adm_d", "ci", "operator", 4.0, None),  # another role: kept
    ]
    with engine.begin() as conn:
        for token_id, name, role, created, revoked in rows:
            conn.execute(
                sa.text(
                    "INSERT INTO admin_tokens (id, name, role, prefix, salt, secret_hash, created_at, revoked_at) "
                    "VALUES (:id, :name, :role, 'p', 's', 'h', :c, :r)"
                ),
                {"id": token_id, "name": name, "role": role, "c": created, "r": revoked},
            )
    db_upgrade(store_url)
    with engine.connect() as conn:
        names: dict[str, str] = {row.id: row.name for row in conn.execute(sa.text("SELECT id, name FROM admin_tokens"))}
    assert names == {"adm_a": "ci", "adm_b": "ci (adm_b)", "adm_c": "ci", "adm_d": "ci"}
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:  # the index, under any writer
        conn.execute(sa.text("UPDATE admin_tokens SET name = 'ci' WHERE id = 'adm_b'"))
    engine.dispose()


@pytest.mark.postgres
def test_concurrent_upgrades_on_a_fresh_postgres_database_both_succeed() -> None:
    """Two `evolving-infra db upgrade` processes on one fresh database (what two
    gateway init containers do): the advisory lock serialises them, so neither
    trips over the other's half-created tables."""
    import psycopg

    with pg_database() as name:
        url = PG_URL.format(host="127.0.0.1", port=5432, name=name)
        # Hold the migration lock so both processes are certainly waiting at once,
        # then let them go together.
        with psycopg.connect(f"host=127.0.0.1 port=5432 user=postgres dbname={name}", autocommit=True) as holder:
            holder.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
            env = {**os.environ, "EVOLVING_DB_URL": url}
            procs = [
                subprocess.Popen(
                    [sys.executable, "-m", "cli.main", "db", "upgrade"],
                    cwd=ROOT,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                )
                for _ in range(2)
            ]
            try:
                deadline = time.monotonic() + 60
                waiting = 0
                while waiting < 2 and time.monotonic() < deadline:
                    assert all(p.poll() is None for p in procs), "an upgrade finished while the lock was held"
                    count = holder.execute(
                        "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
                        "WHERE l.locktype = 'advisory' AND NOT l.granted AND d.datname = %s",
                        (name,),
                    ).fetchone()
                    waiting = count[0] if count else 0
                    time.sleep(0.1)
                assert waiting == 2, "the upgrades did not wait on the migration lock"
                assert db_revision(url) is None  # nothing migrated behind the lock
            finally:
                holder.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))
                outputs = [p.communicate(timeout=120)[0].decode() for p in procs]
        assert [p.returncode for p in procs] == [0, 0], outputs
        assert db_revision(url) == HEAD
        assert _tables(url) >= STORE_TABLES
        db_upgrade(url)  # a third, later upgrade is a no-op
        assert db_revision(url) == HEAD


def test_tenant_key_policy_roundtrip(migrated_db: Database) -> None:
    db = migrated_db
    policy = Policy(
        requests_per_minute=10,
        tokens_per_minute=1000,
        max_concurrent=2,
        priority=0,
        allowed_models=("m1", "m2"),
        max_active_branches=3,
        kv_retention_blocks=50,
        cache_isolation=False,
    )
    with db.session() as s:
        tenant = repository.create_tenant(s, name="acme", policy=policy, now=100.0)
        key, secret = repository.create_api_key(s, tenant_id=tenant.id, name="ci", pepper=db.pepper, now=101.0)
    assert secret.startswith(TENANT_KEY_PREFIX) and key.prefix == secret[:12]
    assert secret not in (key.secret_hash, key.salt)
    assert verify_secret(secret, salt=key.salt, pepper=db.pepper, secret_hash=key.secret_hash)
    assert not verify_secret(secret, salt=key.salt, pepper="other", secret_hash=key.secret_hash)
    with db.session() as s:
        assert repository.get_policy(s, tenant_id=tenant.id) == policy
        grants = repository.load_key_grants(s)
        assert [(g.key_id, g.tenant_id, g.tenant_name, g.policy) for g in grants] == [
            (key.id, tenant.id, "acme", policy)
        ]
        assert repository.load_key_grants(s, prefix="nope") == []
        with pytest.raises(errors.Conflict):
            repository.create_tenant(s, name="acme")
    with db.session() as s:
        revoked = repository.revoke_api_key(s, tenant_id=tenant.id, key_id=key.id, now=200.0)
        assert revoked is not None and revoked.revoked_at == 200.0
        assert repository.revoke_api_key(s, tenant_id="other", key_id=key.id) is None
    with db.session() as s:
        assert repository.load_key_grants(s) == []
        rows, total = repository.list_api_keys(s, tenant_id=tenant.id)
        assert total == 1 and rows[0].revoked_at == 200.0
        renamed = repository.rename_tenant(s, tenant_id=tenant.id, name="acme2")
        assert renamed is not None and renamed.name == "acme2"
    with db.session() as s:
        assert repository.delete_tenant(s, tenant_id=tenant.id)
    with db.session() as s:
        assert repository.get_tenant(s, tenant_id=tenant.id) is None
        assert repository.list_api_keys(s, tenant_id=tenant.id) == ([], 0)
        assert repository.get_policy(s, tenant_id=tenant.id) == Policy()


def test_tenant_paging(migrated_db: Database) -> None:
    with migrated_db.session() as s:
        for i in range(5):
            repository.create_tenant(s, name=f"t{i}", tenant_id=f"t{i}", now=float(i))
    with migrated_db.session() as s:
        rows, total = repository.list_tenants(s, limit=2, offset=1)
    assert total == 5 and [t.id for t in rows] == ["t1", "t2"]


def _decision(t: float, acted: bool) -> Decision:
    pred = SplitPrediction(
        prefill_nodes=1,
        decode_nodes=3,
        throughput_rps=2.0,
        throughput_lo_rps=1.5,
        throughput_hi_rps=2.5,
        tokens_per_s=300.0,
        ttft_s=0.4,
        tpot_s=0.05,
        feasible=True,
        switch_cost_s=math.inf,
    )
    return Decision(
        t=t,
        planner="online",
        current_split=(2, 2),
        chosen_split=(1, 3),
        actions=(SwitchAction("n1", Phase.DECODE),),
        acted=acted,
        reason="decode-heavy",
        confidence=0.97,
        predictions=(pred,),
        inputs={"arrival_rps": 1.5, "bad": math.nan},
    )


def test_decisions_and_switch_events(migrated_db: Database) -> None:
    with migrated_db.session() as s:
        for i in range(4):
            repository.add_decision(s, decision=_decision(1000.0 + i, acted=i % 2 == 0), mode="auto")
        for i, outcome in enumerate(["ok", "failed", "ok"]):
            repository.add_switch_event(
                s,
                t=2000.0 + i,
                outcome=SwitchOutcome(f"n{i % 2}", Phase.PREFILL, Phase.DECODE, 1.0, 2.0, 3.5, outcome),
                reason="Planner: decode-heavy" if i else "manual",
                who="planner" if i else "alice",
            )
    with migrated_db.session() as s:
        rows, total = repository.list_decisions(s, acted=True)
        assert total == 2 and [r.t for r in rows] == [1002.0, 1000.0]
        row = rows[0]
        assert (row.current_prefill, row.current_decode, row.chosen_prefill, row.chosen_decode) == (2, 2, 1, 3)
        assert row.inputs == {"arrival_rps": 1.5, "bad": None}
        assert row.predictions is not None
        assert row.predictions[0]["switch_cost_s"] is None and row.predictions[0]["ttft_s"] == 0.4
        assert row.actions == [{"node_id": "n1", "to_phase": "decode"}]
        rows, total = repository.list_decisions(s, since=1001.0, until=1003.0)
        assert total == 2 and [r.t for r in rows] == [1002.0, 1001.0]
        rows, total = repository.list_decisions(s, limit=1, offset=3)
        assert total == 4 and rows[0].t == 1000.0
        latest = repository.latest_predictions(s)
        assert latest is not None
        t, (pred,) = latest
        assert t == 1003.0 and pred == _decision(0.0, False).predictions[0]  # inf stored as null comes back
        repository.add_decision(s, decision=dataclasses.replace(_decision(1004.0, False), predictions=()), mode="auto")
    with migrated_db.session() as s:  # a later decision without predictions does not hide the last ones
        latest = repository.latest_predictions(s)
        assert latest is not None and latest[0] == 1003.0
        events, total = repository.list_switch_events(s, reason="DECODE-heavy")
        assert total == 2 and {r.outcome for r in events} == {"ok", "failed"}
        events, total = repository.list_switch_events(s, node_id="n0", outcome="ok")
        assert total == 2 and [r.who for r in events] == ["planner", "alice"]
        assert events[0].total_s == 3.5


def test_usage_upsert_adds(migrated_db: Database) -> None:
    minute = repository.minute_of(6_000_030.5)
    assert minute == 6_000_000
    for _ in range(2):
        with migrated_db.session() as s:
            repository.add_usage(
                s,
                tenant_id="t1",
                minute=minute,
                model="m",
                requests=2,
                prompt_tokens=100,
                cached_tokens=40,
                completion_tokens=7,
            )
    with migrated_db.session() as s:
        repository.add_usage(
            s,
            tenant_id="t1",
            minute=minute + 60,
            model="m",
            requests=1,
            prompt_tokens=1,
            cached_tokens=0,
            completion_tokens=1,
        )
        rows = repository.list_usage(s, tenant_id="t1")
        assert [(r.minute, r.requests, r.prompt_tokens, r.cached_tokens, r.completion_tokens) for r in rows] == [
            (minute, 4, 200, 80, 14),
            (minute + 60, 1, 1, 0, 1),
        ]
        assert len(repository.list_usage(s, tenant_id="t1", since=minute + 1)) == 1
        assert repository.list_usage(s, tenant_id="t2") == []


def test_overrides_and_audit(migrated_db: Database) -> None:
    with migrated_db.session() as s:
        repository.set_override(s, key=repository.SPLIT_PIN, value=2, who="alice")
        repository.set_override(s, key=repository.PLANNER_MODE, value="advisory", who="alice")
        repository.set_override(s, key=repository.NODE_PIN_PREFIX + "n1", value="prefill", who="bob")
        repository.add_audit(
            s,
            actor="alice",
            action="pins.split",
            target="split",
            before={"prefill_nodes": None},
            after={"prefill_nodes": 2},
            t=10.0,
        )
        repository.add_audit(s, actor="bob", actor_id="adm_bob", action="pins.node", target="node:n1", t=11.0)
    with migrated_db.session() as s:
        o = repository.get_overrides(s)
        assert (o.split_pin, o.planner_mode, o.node_pins) == (2, "advisory", {"n1": "prefill"})
        repository.set_override(s, key=repository.SPLIT_PIN, value=None, who="alice")
    with migrated_db.session() as s:
        assert repository.get_overrides(s).split_pin is None
        rows, total = repository.list_audit(s)
        assert total == 2 and [r.actor for r in rows] == ["bob", "alice"]
        assert rows[1].after == {"prefill_nodes": 2} and rows[0].before is None
        assert repository.list_audit(s, actor="alice")[1] == 1
        assert [r.actor for r in repository.list_audit(s, actor_id="adm_bob")[0]] == ["bob"]
        assert rows[1].actor_id is None  # not given


def test_admin_tokens(migrated_db: Database) -> None:
    db = migrated_db
    with db.session() as s:
        row, secret = repository.create_admin_token(s, name="ops", role="operator", pepper=db.pepper)
        imported, same = repository.create_admin_token(s, name="env", role="viewer", pepper=db.pepper, secret="x" * 20)
    assert same == "x" * 20
    with db.session() as s:
        found = repository.find_admin_token(s, secret=secret, pepper=db.pepper)
        assert found is not None and found.id == row.id
        found = repository.find_admin_token(s, secret="x" * 20, pepper=db.pepper)
        assert found is not None and found.id == imported.id
        assert repository.find_admin_token(s, secret=secret + "x", pepper=db.pepper) is None
        assert repository.count_active_admin_tokens(s) == 2
        repository.revoke_admin_token(s, token_id=imported.id)
    with db.session() as s:
        assert repository.find_admin_token(s, secret="x" * 20, pepper=db.pepper) is None
        assert repository.count_active_admin_tokens(s, role="operator") == 1
        with pytest.raises(errors.Conflict):
            repository.create_admin_token(s, name="ops", role="operator", pepper=db.pepper)
        repository.create_admin_token(s, name="env", role="viewer", pepper=db.pepper)  # the old one is revoked


def test_policy_check_constraint_on_database(migrated_db: Database) -> None:
    from gateway.store.tables import TenantPolicy

    with migrated_db.session() as s:
        repository.create_tenant(s, name="c", tenant_id="c")
    with pytest.raises(sa.exc.IntegrityError), migrated_db.session() as s:
        row = s.get(TenantPolicy, "c")
        assert row is not None
        row.priority = 9


def test_a_moves_predicted_and_realized_gain_are_stored_with_its_decisions(migrated_db: Database) -> None:
    move = dataclasses.replace(_decision(1000.0, True), inputs={"move_predicted_gain_frac": 0.21})
    check = {"verified_move_t": 1000.0, "predicted_gain_frac": 0.21, "realized_gain_frac": -0.18, "move_reverted": 1.0}
    revert = dataclasses.replace(_decision(1070.0, True), inputs=check)
    with migrated_db.session() as s:
        for d in (move, revert, _decision(1080.0, False)):
            repository.add_decision(s, decision=d, mode="auto")
    with migrated_db.session() as s:
        rows, total = repository.list_decisions(s, checked=True)
        assert total == 1 and (rows[0].t, rows[0].predicted_gain, rows[0].realized_gain) == (1070.0, 0.21, -0.18)
        rows, total = repository.list_decisions(s, checked=False)
        assert [(r.t, r.predicted_gain, r.realized_gain) for r in rows] == [(1080.0, None, None), (1000.0, 0.21, None)]
