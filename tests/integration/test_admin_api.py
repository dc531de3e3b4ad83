"""Admin API through httpx against the real router and a real store (SQLite
and PostgreSQL), with `FakeClusterControl` standing in for the cluster."""

from __future__ import annotations

import csv
import io
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from core import Phase
from gateway.admin import bootstrap_admin_token, build_admin_router
from gateway.http.error_responses import install_error_handlers
from gateway.store import Database, EventSink, repository
from gateway.store.records import SwitchOutcome
from planner.types import Decision
from testing.fake_cluster import FakeClusterControl


class Admin:
    def __init__(self, db: Database) -> None:
        self.db = db
        self.control = FakeClusterControl()
        self.sink = EventSink(db)
        app = FastAPI()
        app.include_router(build_admin_router(control=self.control, db=db, sink=self.sink))
        install_error_handlers(app)
        self.app = app
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://admin")
        token = bootstrap_admin_token(db, None)
        assert token is not None
        self.operator = {"Authorization": f"Bearer {token}"}

    async def audit(self, action: str) -> list[dict[str, Any]]:
        await self.sink.flush_all()
        r = await self.client.get("/admin/audit", params={"action": action}, headers=self.operator)
        assert r.status_code == 200
        return r.json()["items"]


@pytest.fixture
async def admin(migrated_db: Database) -> AsyncIterator[Admin]:
    a = Admin(migrated_db)
    yield a
    await a.client.aclose()


async def _viewer(admin: Admin) -> dict[str, str]:
    r = await admin.client.post("/admin/tokens", json={"name": "eve", "role": "viewer"}, headers=admin.operator)
    assert r.status_code == 201
    return {"Authorization": f"Bearer {r.json()['secret']}"}


async def test_whoami_and_auth(admin: Admin) -> None:
    c = admin.client
    assert (await c.get("/admin/whoami", headers=admin.operator)).json() == {"name": "bootstrap", "role": "operator"}
    r = await c.get("/admin/whoami")
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert (await c.get("/admin/whoami", headers={"Authorization": "Bearer eia-nope"})).status_code == 401
    with admin.db.session() as s:
        tenant = repository.create_tenant(s, name="acme")
        _, tenant_key = repository.create_api_key(s, tenant_id=tenant.id, pepper=admin.db.pepper)
    assert (await c.get("/admin/cluster", headers={"Authorization": f"Bearer {tenant_key}"})).status_code == 401
    viewer = await _viewer(admin)
    assert (await c.get("/admin/whoami", headers=viewer)).json() == {"name": "eve", "role": "viewer"}


async def test_viewer_reads_but_cannot_write(admin: Admin) -> None:
    viewer = await _viewer(admin)
    c = admin.client
    for path in [
        "/admin/cluster",
        "/admin/planner",
        "/admin/pins",
        "/admin/switches",
        "/admin/decisions",
        "/admin/tenants",
        "/admin/audit",
        "/admin/cluster/history",
    ]:
        assert (await c.get(path, headers=viewer)).status_code == 200, path
    writes = [
        ("PUT", "/admin/planner/mode", {"mode": "manual"}),
        ("PUT", "/admin/pins/split", {"prefill_nodes": 1}),
        ("DELETE", "/admin/pins/split", None),
        ("PUT", "/admin/pins/nodes/n0", {"phase": "decode"}),
        ("POST", "/admin/switch", {"node_id": "n0", "to_phase": "decode"}),
        ("POST", "/admin/tenants", {"name": "x"}),
        ("POST", "/admin/tokens", {"name": "x", "role": "operator"}),
        ("GET", "/admin/tokens", None),
    ]
    for method, path, body in writes:
        r = await c.request(method, path, json=body, headers=viewer)
        assert r.status_code == 403, (method, path, r.text)
        assert r.json()["error"]["code"] == "insufficient_role"
    assert admin.control.mode == "auto" and not [c for c in admin.control.calls if c[0] == "switch"]


async def test_cluster_planner_pins_and_switch(admin: Admin) -> None:
    c, op = admin.client, admin.operator
    cluster = (await c.get("/admin/cluster", headers=op)).json()
    assert cluster["split"] == [1, 1] and [n["node_id"] for n in cluster["nodes"]] == ["n0", "n1"]
    assert cluster["directory"] == {
        "blocks": 10,
        "bytes": 0,
        "referenced": 0,
        "branches": 0,
        "hit_rate": 0.0,
        "available": True,
    }
    assert cluster["top_branches"] == [{"branch_id": "b", "tenant_id": "t", "blocks": 3}]
    assert (await c.get("/admin/cluster/history", params={"minutes": 5}, headers=op)).json()["items"][0]["prefill"] == 1
    assert ("history", 300.0) in admin.control.calls
    assert (await c.get("/admin/planner", headers=op)).json()["mode"] == "auto"

    assert (await c.put("/admin/planner/mode", json={"mode": "advisory"}, headers=op)).json() == {"mode": "advisory"}
    assert admin.control.mode == "advisory"
    assert (await c.put("/admin/planner/mode", json={"mode": "bogus"}, headers=op)).status_code == 400

    assert (await c.put("/admin/pins/split", json={"prefill_nodes": 1}, headers=op)).json()["split"] == 1
    r = await c.put("/admin/pins/split", json={"prefill_nodes": 3}, headers=op)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prefill_nodes"
    assert (await c.put("/admin/pins/nodes/n1", json={"phase": "decode"}, headers=op)).json() == {
        "split": 1,
        "nodes": {"n1": "decode"},
    }
    assert (await c.put("/admin/pins/nodes/zz", json={"phase": "decode"}, headers=op)).status_code == 404
    assert (await c.get("/admin/pins", headers=op)).json() == {"split": 1, "nodes": {"n1": "decode"}}
    assert (await c.delete("/admin/pins/split", headers=op)).json()["split"] is None

    r = await c.post("/admin/switch", json={"node_id": "n0", "to_phase": "decode", "reason": "drill"}, headers=op)
    assert r.status_code == 200
    assert r.json() == {
        "node_id": "n0",
        "from_phase": "prefill",
        "to_phase": "decode",
        "drain_s": 0.5,
        "migrate_s": 1.0,
        "total_s": 1.6,
        "outcome": "ok",
        "detail": "",
    }
    assert admin.control.calls[-1] == ("switch", "n0", "decode", "drill", "bootstrap")
    assert (await c.post("/admin/switch", json={"node_id": "zz", "to_phase": "decode"}, headers=op)).status_code == 404

    (mode,) = await admin.audit("planner.mode")
    assert (mode["actor"], mode["before"], mode["after"]) == ("bootstrap", {"mode": "auto"}, {"mode": "advisory"})
    (switch,) = await admin.audit("switch")
    assert switch["target"] == "node:n0" and switch["before"] == {"phase": "prefill", "reason": "drill"}
    assert switch["after"]["total_s"] == 1.6
    assert [a["after"] for a in await admin.audit("pins.split")] == [{"prefill_nodes": 1}]
    assert [a["before"] for a in await admin.audit("pins.split.clear")] == [{"prefill_nodes": 1}]
    assert len(await admin.audit("pins.node")) == 1
    with admin.db.session() as s:  # persisted so a restart keeps them
        overrides = repository.get_overrides(s)
    assert (overrides.split_pin, overrides.node_pins, overrides.planner_mode) == (None, {"n1": "decode"}, "advisory")


async def test_switch_and_decision_history(admin: Admin) -> None:
    with admin.db.session() as s:
        for i in range(5):
            repository.add_switch_event(
                s,
                t=100.0 + i,
                reason="planner" if i % 2 else "manual drill",
                who="planner" if i % 2 else "alice",
                outcome=SwitchOutcome(f"n{i % 2}", Phase.PREFILL, Phase.DECODE, 1, 2, 3, "ok"),
            )
            repository.add_decision(
                s,
                mode="auto",
                decision=Decision(
                    t=200.0 + i,
                    planner="online",
                    current_split=(1, 1),
                    chosen_split=(1, 1),
                    actions=(),
                    acted=i == 4,
                    reason=f"r{i}",
                    confidence=0.5,
                    inputs={"x": 1.0},
                ),
            )
    c, op = admin.client, admin.operator
    r = (await c.get("/admin/switches", params={"node": "n1", "limit": 1, "offset": 1}, headers=op)).json()
    assert r["total"] == 2 and [i["t"] for i in r["items"]] == [101.0]
    r = (await c.get("/admin/switches", params={"reason": "drill", "since": 101, "until": 104}, headers=op)).json()
    assert [i["t"] for i in r["items"]] == [102.0]
    r = (await c.get("/admin/switches", params={"since": "1970-01-01T00:01:43Z"}, headers=op)).json()
    assert [i["t"] for i in r["items"]] == [104.0, 103.0]  # ISO-8601 works as well as unix seconds
    r = await c.get("/admin/switches", params={"format": "csv"}, headers=op)
    assert r.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert len(rows) == 5 and rows[0]["node_id"] == "n0" and rows[0]["t"] == "104.0"
    r = (await c.get("/admin/decisions", params={"acted": "true"}, headers=op)).json()
    assert r["total"] == 1 and r["items"][0]["reason"] == "r4" and r["items"][0]["chosen_split"] == [1, 1]
    r = await c.get("/admin/decisions", params={"format": "csv", "acted": "false"}, headers=op)
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert len(rows) == 4 and rows[0]["inputs"] == '{"x": 1.0}'
    assert (await c.get("/admin/decisions", params={"limit": 0}, headers=op)).status_code == 400


async def test_tenant_key_policy_crud_with_audit(admin: Admin) -> None:
    c, op = admin.client, admin.operator
    r = await c.post(
        "/admin/tenants", json={"name": "acme", "id": "acme", "policy": {"requests_per_minute": 5}}, headers=op
    )
    assert r.status_code == 201 and r.json()["id"] == "acme"
    assert (await c.post("/admin/tenants", json={"name": "acme"}, headers=op)).status_code == 409
    assert (await c.get("/admin/tenants", headers=op)).json()["total"] == 1
    assert (await c.get("/admin/tenants/acme", headers=op)).json()["name"] == "acme"
    assert (await c.get("/admin/tenants/nope", headers=op)).status_code == 404
    assert (await c.patch("/admin/tenants/acme", json={"name": "ACME"}, headers=op)).json()["name"] == "ACME"

    r = await c.post("/admin/tenants/acme/keys", json={"name": "ci"}, headers=op)
    assert r.status_code == 201
    created = r.json()
    assert created["secret"].startswith("sk-ei-") and created["prefix"] == created["secret"][:12]
    keys = (await c.get("/admin/tenants/acme/keys", headers=op)).json()
    assert keys["total"] == 1 and "secret" not in keys["items"][0]
    r = await c.delete(f"/admin/tenants/acme/keys/{created['id']}", headers=op)
    assert r.status_code == 200 and r.json()["revoked_at"] is not None
    assert (await c.delete("/admin/tenants/acme/keys/nope", headers=op)).status_code == 404

    policy = (await c.get("/admin/tenants/acme/policy", headers=op)).json()
    assert policy["requests_per_minute"] == 5 and policy["cache_isolation"] is True
    new = {**policy, "priority": 0, "allowed_models": ["m"], "cache_isolation": False}
    assert (await c.put("/admin/tenants/acme/policy", json=new, headers=op)).json() == new
    for bad in [{"priority": 7}, {"requests_per_minute": 0}, {"allowed_models": ["a", "a"]}, {"bogus": 1}]:
        r = await c.put("/admin/tenants/acme/policy", json=bad, headers=op)
        assert r.status_code == 400, bad
        assert r.json()["error"]["type"] == "invalid_request_error"
    assert (await c.get("/admin/tenants/acme/policy", headers=op)).json() == new

    with admin.db.session() as s:
        repository.add_usage(
            s,
            tenant_id="acme",
            minute=600,
            model="m",
            requests=2,
            prompt_tokens=10,
            cached_tokens=4,
            completion_tokens=3,
        )
        repository.add_usage(
            s,
            tenant_id="acme",
            minute=660,
            model="m",
            requests=1,
            prompt_tokens=1,
            cached_tokens=0,
            completion_tokens=1,
        )
    usage = (await c.get("/admin/tenants/acme/usage", params={"since": 600, "until": 660}, headers=op)).json()
    assert usage["items"] == [
        {"minute": 600, "model": "m", "requests": 2, "prompt_tokens": 10, "cached_tokens": 4, "completion_tokens": 3}
    ]

    assert (await c.delete("/admin/tenants/acme", headers=op)).status_code == 204
    assert (await c.get("/admin/tenants/acme", headers=op)).status_code == 404

    (create,) = await admin.audit("tenant.create")
    assert create["actor"] == "bootstrap" and create["after"]["policy"]["requests_per_minute"] == 5
    (update,) = await admin.audit("tenant.update")
    assert (update["before"]["name"], update["after"]["name"]) == ("acme", "ACME")
    (key_create,) = await admin.audit("api_key.create")
    assert key_create["after"]["prefix"] == created["prefix"] and created["secret"] not in str(key_create)
    assert len(await admin.audit("api_key.revoke")) == 1
    (pol,) = await admin.audit("policy.update")
    assert (pol["before"]["priority"], pol["after"]["priority"]) == (1, 0)
    (delete,) = await admin.audit("tenant.delete")
    assert delete["before"]["name"] == "ACME" and delete["after"] is None


async def test_admin_tokens_lifecycle(admin: Admin) -> None:
    c, op = admin.client, admin.operator
    viewer = await _viewer(admin)
    tokens = (await c.get("/admin/tokens", headers=op)).json()
    assert tokens["total"] == 2 and {t["role"] for t in tokens["items"]} == {"viewer", "operator"}
    viewer_id = next(t["id"] for t in tokens["items"] if t["role"] == "viewer")
    assert (await c.delete(f"/admin/tokens/{viewer_id}", headers=op)).status_code == 200
    assert (await c.get("/admin/whoami", headers=viewer)).status_code == 401
    op_id = next(t["id"] for t in tokens["items"] if t["role"] == "operator")
    r = await c.delete(f"/admin/tokens/{op_id}", headers=op)
    assert r.status_code == 409  # never lock everyone out
    assert (await c.get("/admin/whoami", headers=op)).status_code == 200
    (created,) = await admin.audit("admin_token.create")
    (revoked,) = await admin.audit("admin_token.revoke")
    (boot,) = await admin.audit("admin_token.bootstrap")
    # The audit row names the token that acted by its id, not only by its (reusable) name.
    assert (created["actor"], created["actor_id"]) == ("bootstrap", op_id)
    assert revoked["actor_id"] == op_id and boot["actor_id"] == "system"
    only = (await c.get("/admin/audit", params={"actor_id": op_id}, headers=op)).json()
    assert only["total"] == 2 and {a["action"] for a in only["items"]} == {"admin_token.create", "admin_token.revoke"}


async def test_admin_token_names_are_unique_per_role_among_active_tokens(admin: Admin) -> None:
    c, op = admin.client, admin.operator
    r = await c.post("/admin/tokens", json={"name": "ci", "role": "viewer"}, headers=op)
    assert r.status_code == 201
    first = r.json()["id"]
    r = await c.post("/admin/tokens", json={"name": "ci", "role": "viewer"}, headers=op)
    assert r.status_code == 409 and r.json()["error"]["param"] == "name"
    assert (await c.post("/admin/tokens", json={"name": "ci", "role": "operator"}, headers=op)).status_code == 201
    # Once the first is revoked its name is free again (rotation).
    assert (await c.delete(f"/admin/tokens/{first}", headers=op)).status_code == 200
    assert (await c.post("/admin/tokens", json={"name": "ci", "role": "viewer"}, headers=op)).status_code == 201
    names = [
        (t["name"], t["role"], t["revoked_at"] is None)
        for t in (await c.get("/admin/tokens", headers=op)).json()["items"]
    ]
    assert sorted(names) == sorted(
        [("bootstrap", "operator", True), ("ci", "viewer", False), ("ci", "operator", True), ("ci", "viewer", True)]
    )


async def test_bootstrap_is_once_and_env_token_imports(migrated_db: Database) -> None:
    assert bootstrap_admin_token(migrated_db, "env-token-0123456789") is None
    assert bootstrap_admin_token(migrated_db, None) is None  # a token exists already
    assert bootstrap_admin_token(migrated_db, "env-token-0123456789") is None  # idempotent
    with migrated_db.session() as s:
        assert repository.count_active_admin_tokens(s, role="operator") == 1
    with pytest.raises(ValueError, match="at least 16 characters"):
        bootstrap_admin_token(migrated_db, "short")
    app = FastAPI()
    app.include_router(build_admin_router(control=FakeClusterControl(), db=migrated_db, sink=EventSink(migrated_db)))
    install_error_handlers(app)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://a") as c:
        r = await c.get("/admin/whoami", headers={"Authorization": "Bearer env-token-0123456789"})
    assert r.json() == {"name": "env", "role": "operator"}
    # A second, different env token while the first is still active: a free name, never a duplicate.
    assert bootstrap_admin_token(migrated_db, "another-env-token-0123") is None
    with migrated_db.session() as s:
        names = sorted(t.name for t in repository.list_admin_tokens(s)[0])
    assert names == ["env", "env-2"]


def test_replicas_starting_at_once_import_the_env_token_once(migrated_db: Database) -> None:
    """Several gateway replicas start together with the same EVOLVING_ADMIN_TOKEN:
    one imports it, the others find it (no unique-name error stops a start)."""
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: bootstrap_admin_token(migrated_db, "env-token-0123456789"), range(4)))
    assert results == [None] * 4
    with migrated_db.session() as s:
        assert [t.name for t in repository.list_admin_tokens(s)[0]] == ["env"]


def test_openapi_documents_every_route(migrated_db: Database) -> None:
    app = FastAPI()
    app.include_router(build_admin_router(control=FakeClusterControl(), db=migrated_db, sink=EventSink(migrated_db)))
    spec = app.openapi()
    ops = [op for path in spec["paths"].values() for op in path.values()]
    assert len(spec["paths"]) == 20 and all(op.get("summary") for op in ops)
    assert "HTTPBearer" in spec["components"]["securitySchemes"]
