"""Tenant policies, admin auth and the event history through the REAL gateway.

The app is `gateway.compose.compose_app` (control plane + planner loop + gateway)
served over HTTP on localhost, in front of fake workers
(`testing.fake_worker_app`), with a real store: SQLite, and PostgreSQL for the
tests marked `postgres` (including the outage test, which makes the database
refuse connections while the gateway serves).
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from core import Phase
from gateway.compose import ControlPlane, compose_app
from gateway.serving.policy import GateConfig, StoreTenantGate
from gateway.serving.policy.tenancy import OpenTenantGate
from gateway.serving.tokenize import PromptTokenizer
from gateway.settings import GatewaySettings
from gateway.store import SinkConfig, StoreUnavailable, repository
from kvpool.directory import BranchLimitReached, create_directory
from planner.types import ClusterView, Decision, PlannerMode, SwitchAction
from testing.fake_worker import FakeWorker
from testing.fake_worker_app import create_fake_worker_app
from testing.stacks import serve
from testing.stores import PG_URL, pg_admin, pg_database
from testing.waiting import wait_for

FAST_SINK = SinkConfig(flush_interval_s=0.05, retry_initial_s=0.05, retry_max_s=0.2)
FAST_GATE = GateConfig(refresh_interval_s=0.2, admission_wait_s=0.5)
LONG_TEXT = "Agents call tools, read their results and continue the conversation with a cached prefix. " * 6


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
        return
    with pg_database() as name:
        yield PG_URL.format(host="127.0.0.1", port=5432, name=name)


class ScriptedPlanner:
    """Switches w0 to decode once, when the mode is auto (a `planner.types.Planner`)."""

    name = "scripted"

    def __init__(self) -> None:
        self.done = False

    def observe_iterations(self, records: list) -> None:
        return None

    def observe_requests(self, samples: list) -> None:
        return None

    def decide(self, view: ClusterView) -> Decision:
        prefill = sum(n.phase is Phase.PREFILL for n in view.nodes)
        split = (prefill, len(view.nodes) - prefill)
        w0 = next((n for n in view.nodes if n.node_id == "w0"), None)
        act = view.mode is PlannerMode.AUTO and not self.done and w0 is not None and w0.phase is Phase.PREFILL
        if not act:
            return Decision(
                t=view.now,
                planner=self.name,
                current_split=split,
                chosen_split=split,
                actions=(),
                acted=False,
                reason="hold",
            )
        self.done = True
        return Decision(
            t=view.now,
            planner=self.name,
            current_split=split,
            chosen_split=(split[0] - 1, split[1] + 1),
            actions=(SwitchAction("w0", Phase.DECODE),),
            acted=True,
            reason="scripted move",
            confidence=0.99,
        )


@dataclass
class Product:
    url: str
    app: Any
    cp: ControlPlane
    http: httpx.AsyncClient
    admin_token: str

    @property
    def runtime(self) -> Any:
        return self.app.state.runtime

    def op(self, token: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token or self.admin_token}"}

    async def tenant(self, tenant_id: str, **policy: Any) -> str:
        """Create a tenant with `policy` through the admin API; returns a new API key."""
        r = await self.http.post(
            "/admin/tenants", json={"name": tenant_id, "id": tenant_id, "policy": policy}, headers=self.op()
        )
        assert r.status_code == 201, r.text
        r = await self.http.post(f"/admin/tenants/{tenant_id}/keys", json={"name": "k"}, headers=self.op())
        assert r.status_code == 201, r.text
        return r.json()["secret"]

    async def chat(
        self,
        key: str | None,
        *,
        branch: str | None = None,
        model: str = "demo",
        max_tokens: int = 4,
        content: str = "Hello there, agent.",
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        h = dict(headers or {})
        if key is not None:
            h["Authorization"] = f"Bearer {key}"
        if branch is not None:
            h["X-Branch-ID"] = branch
        return await self.http.post(
            "/v1/chat/completions",
            headers=h,
            json={
                "model": model,
                "max_tokens": max_tokens,
                "temperature": 0,
                "messages": [{"role": "user", "content": content}],
            },
        )


@contextlib.asynccontextmanager
async def product(
    tokenizer: PromptTokenizer,
    data_dir: pathlib.Path,
    db_url: str,
    *,
    phases: tuple[Phase, ...] = (Phase.PREFILL, Phase.DECODE),
    delay: float = 0.0,
    planner: Any = None,
    admin_token: str | None = None,
    **settings: Any,
) -> AsyncIterator[Product]:
    async with contextlib.AsyncExitStack() as es:
        urls = []
        for i, phase in enumerate(phases):
            w = FakeWorker(
                f"w{i}", phase=phase, token_delay_s=delay, token_range=(10, tokenizer.vocab_size), block_size=16
            )
            urls.append(await es.enter_async_context(serve(create_fake_worker_app(w))))
        cfg = GatewaySettings(
            model_name="demo",
            worker_urls=tuple(urls),
            heartbeat_interval_s=0.05,
            local_prefill_max_tokens=8,
            max_body_bytes=64 * 1024,
            block_size=16,
            db_url=db_url,
            data_dir=str(data_dir),
            planner_interval_s=0.05,
            secret_pepper="test-pepper",
            admin_token=admin_token,
            **settings,
        )
        cp = ControlPlane.build(cfg, sink_config=FAST_SINK, gate_config=FAST_GATE)
        app = compose_app(cfg, control_plane=cp, planner=planner, tokenizer=tokenizer)
        url = await es.enter_async_context(serve(app))
        http = await es.enter_async_context(httpx.AsyncClient(base_url=url, timeout=30))
        yield Product(url, app, cp, http, cp.first_admin_token or admin_token or "")


def assert_openai_error(r: httpx.Response, status: int, type_: str, code: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == type_ and err["message"]
    if code is not None:
        assert err["code"] == code
    return err


def retry_after(r: httpx.Response) -> int:
    value = int(r.headers["retry-after"])
    assert value >= 1
    return value


# -- policies -------------------------------------------------------------------


async def test_policies_enforced_with_exact_statuses(tokenizer, tmp_path, db_url) -> None:
    async with product(tokenizer, tmp_path, db_url) as p:
        free = await p.tenant("free")
        rpm = await p.tenant("rpm", requests_per_minute=2)
        tpm = await p.tenant("tpm", tokens_per_minute=200)
        models = await p.tenant("models", allowed_models=["other-model"])
        branches = await p.tenant("branches", max_active_branches=2)

        # Auth: no key, unknown key -> 401 authentication_error.
        assert_openai_error(await p.chat(None), 401, "authentication_error", "invalid_api_key")
        assert_openai_error(await p.chat("sk-not-a-key-at-all"), 401, "authentication_error", "invalid_api_key")

        # Requests per minute: two pass, the third is 429 with Retry-After.
        assert (await p.chat(rpm)).status_code == 200
        assert (await p.chat(rpm)).status_code == 200
        r = await p.chat(rpm)
        assert_openai_error(r, 429, "rate_limit_error", "requests_per_minute_exceeded")
        assert 55 <= retry_after(r) <= 60  # until the first of the two leaves the one-minute window
        assert (await p.chat(free)).status_code == 200  # nothing else changes, for anyone

        # Tokens per minute (prompt + max_tokens): too large for the whole budget, then exhausted.
        r = await p.chat(tpm, max_tokens=500)
        assert_openai_error(r, 400, "invalid_request_error", "request_exceeds_tokens_per_minute")
        assert "retry-after" not in r.headers  # it can never fit: nothing to retry
        assert (await p.chat(tpm, max_tokens=100)).status_code == 200
        r = await p.chat(tpm, max_tokens=100)
        assert_openai_error(r, 429, "rate_limit_error", "tokens_per_minute_exceeded")
        retry_after(r)

        # Model allow-list: 403 for a served model the key may not use; 404 for an unknown model;
        # /v1/models lists only what the key may use.
        assert_openai_error(await p.chat(models), 403, "permission_error", "model_not_allowed")
        assert_openai_error(await p.chat(free, model="nope"), 404, "invalid_request_error", "model_not_found")
        listed = await p.http.get("/v1/models", headers={"Authorization": f"Bearer {models}"})
        assert listed.status_code == 200 and listed.json()["data"] == []
        listed = await p.http.get("/v1/models", headers={"Authorization": f"Bearer {free}"})
        assert [m["id"] for m in listed.json()["data"]] == [p.runtime.service.model_name]
        one = await p.http.get(
            f"/v1/models/{p.runtime.service.model_name}", headers={"Authorization": f"Bearer {models}"}
        )
        assert_openai_error(one, 404, "invalid_request_error", "model_not_found")

        # Branch cap: two named branches, the third is 429; continuing an open one is fine,
        # a conversation without X-Branch-ID is a branch too (its opening names it), so it
        # counts; finishing one frees a place.
        assert (await p.chat(branches, branch="b1")).status_code == 200
        assert (await p.chat(branches, branch="b2")).status_code == 200
        r = await p.chat(branches, branch="b3")
        assert_openai_error(r, 429, "rate_limit_error", "branch_limit_exceeded")
        assert retry_after(r) == 5
        assert (await p.chat(branches, branch="b1")).status_code == 200
        assert_openai_error(await p.chat(branches), 429, "rate_limit_error", "branch_limit_exceeded")
        assert await p.runtime.directory.active_branch_count("branches") == 2
        r = await p.http.post("/v1/branches/b1/finish", headers={"Authorization": f"Bearer {branches}"})
        assert r.status_code == 200 and r.json()["finished"] is True
        assert (await p.chat(branches, branch="b3")).status_code == 200
        # X-Branch-Finished closes the branch with its last request.
        r = await p.chat(branches, branch="b3", headers={"X-Branch-Finished": "true"})
        assert r.status_code == 200 and await p.runtime.directory.active_branch_count("branches") == 1


async def test_concurrency_cap_and_policy_change(tokenizer, tmp_path) -> None:
    async with product(tokenizer, tmp_path, f"sqlite:///{tmp_path / 's.db'}", delay=0.02) as p:
        key = await p.tenant("cc", max_concurrent=1)
        first = asyncio.create_task(p.chat(key, max_tokens=40))  # ~0.8 s of decoding
        gate = p.cp.gate
        assert isinstance(gate, StoreTenantGate)
        await wait_for(lambda: (limiter := gate._limiters.get("cc")) is not None and limiter.in_flight)
        r = await p.chat(key)
        assert_openai_error(r, 429, "rate_limit_error", "concurrency_limit_exceeded")
        assert retry_after(r) == 1
        assert (await first).status_code == 200
        assert (await p.chat(key)).status_code == 200  # the slot came back

        # A policy change through the admin API applies within one refresh interval.
        r = await p.http.put("/admin/tenants/cc/policy", json={"allowed_models": ["x"]}, headers=p.op())
        assert r.status_code == 200
        await asyncio.sleep(FAST_GATE.refresh_interval_s * 3)
        assert_openai_error(await p.chat(key), 403, "permission_error", "model_not_allowed")


async def test_finish_is_tenant_scoped_and_cache_isolation(tokenizer, tmp_path) -> None:
    async with product(tokenizer, tmp_path, f"sqlite:///{tmp_path / 's.db'}") as p:
        a = await p.tenant("a")
        b = await p.tenant("b")
        shared1 = await p.tenant("shared1", cache_isolation=False)
        shared2 = await p.tenant("shared2", cache_isolation=False)

        # Tenant b cannot finish tenant a's branch of the same name.
        assert (await p.chat(a, branch="work")).status_code == 200
        r = await p.http.post("/v1/branches/work/finish", headers={"Authorization": f"Bearer {b}"})
        assert r.status_code == 200 and r.json()["finished"] is False
        assert await p.runtime.directory.is_branch_active("a/work")
        r = await p.http.post("/v1/branches/work/finish", headers={"Authorization": f"Bearer {a}"})
        assert r.json()["finished"] is True and not await p.runtime.directory.is_branch_active("a/work")

        async def cached(key: str) -> int:
            r = await p.chat(key, content=LONG_TEXT, branch="long")
            assert r.status_code == 200, r.text
            return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

        # a's first request ("work") already cached the stock template's system-prompt prefix
        first = await cached(a)
        assert await cached(a) > first  # its own prefix is cached ...
        assert await cached(b) == 0  # ... and invisible to another isolated tenant
        assert await cached(shared1) == 0
        assert await cached(shared2) > 0  # cache_isolation=false: the shared pool


async def test_kv_retention_quota_leaves_extra_blocks_unpinned(tokenizer, tmp_path) -> None:
    async with product(tokenizer, tmp_path, f"sqlite:///{tmp_path / 's.db'}") as p:
        capped = await p.tenant("capped", kv_retention_blocks=2)
        free = await p.tenant("free")
        for key in (capped, free):
            r = await p.chat(key, content=LONG_TEXT, branch="agent", max_tokens=4)
            assert r.status_code == 200  # the quota never refuses a request
        directory = p.runtime.directory.backend
        assert await directory.branch_blocks("free") > 2
        assert await directory.branch_blocks("capped") == 2  # only the first two blocks pinned
        assert p.runtime.directory.unpinned_over_quota == await directory.branch_blocks("free") - 2
        info = await directory.branch("capped/agent")
        assert info is not None and info.num_blocks == 2


@pytest.mark.parametrize("backend", ["memory", pytest.param("redis", marks=pytest.mark.redis)])
async def test_directory_tenant_counts(backend: str) -> None:
    if backend == "redis":
        import redis

        try:
            redis.Redis.from_url("redis://127.0.0.1:6379/0").ping()
        except redis.RedisError:
            pytest.skip("no Redis server on 127.0.0.1:6379")
        d = create_directory("redis", url="redis://127.0.0.1:6379/0", prefix=f"{{t{time.time_ns()}}}")
    else:
        d = create_directory("memory")
    try:
        await d.open_branch("a/1", "a", 1.0)
        await d.open_branch("a/1", "a", 2.0)  # re-open: still one
        await d.open_branch("a/2", "a", 2.0)
        await d.open_branch("b/1", "b", 2.0)
        await d.reference("a/1", ["h1", "h2"], 3.0)
        await d.reference("a/2", ["h2"], 3.0)
        counts = [await d.active_branch_count(t) for t in ("a", "b", "c")]
        assert counts == [2, 1, 0]
        assert await d.tenant_ref_counts("a", ["h1", "h2", "h3"]) == [1, 2, 0]
        assert await d.tenant_ref_counts("b", ["h1"]) == [0]
        with pytest.raises(BranchLimitReached):  # a third branch of a tenant capped at 2
            await d.open_branch("a/3", "a", 2.5, max_active=2)
        await d.open_branch("a/2", "a", 2.5, max_active=2)  # an active one re-opens under the cap
        await d.finish_branch("a/1")
        assert await d.active_branch_count("a") == 1 and await d.tenant_ref_counts("a", ["h1", "h2"]) == [0, 1]
        assert await d.expire(100.0, 10.0) == ["a/2", "b/1"]
        assert await d.active_branch_count("a") == 0 and await d.active_branch_count("b") == 0
    finally:
        if backend == "redis":
            # The Redis backend's test-only clear(); the directory Protocol does not name it.
            await d.clear()  # type: ignore[attr-defined]


async def test_open_auth_serves_without_keys(tokenizer, tmp_path) -> None:
    async with product(tokenizer, tmp_path, f"sqlite:///{tmp_path / 's.db'}", auth="open") as p:
        assert isinstance(p.cp.gate, OpenTenantGate)
        assert (await p.chat(None)).status_code == 200
        assert (await p.http.get("/admin/whoami", headers=p.op())).status_code == 200  # admin still needs a token
        assert_openai_error(await p.http.get("/admin/whoami"), 401, "authentication_error")


# -- admin API through the gateway ---------------------------------------------------


async def test_admin_auth_roles_and_one_audit_entry_per_write(tokenizer, tmp_path) -> None:
    async with product(tokenizer, tmp_path, f"sqlite:///{tmp_path / 's.db'}") as p:
        assert isinstance(p.cp.gate, StoreTenantGate)

        async def audit_actions() -> list[str]:
            r = await p.http.get("/admin/audit", params={"limit": 1000}, headers=p.op())
            return [e["action"] for e in r.json()["items"]]

        assert await audit_actions() == ["admin_token.bootstrap"]
        key = await p.tenant("acme", requests_per_minute=100)  # tenant.create + api_key.create
        r = await p.http.post("/admin/tokens", json={"name": "watcher", "role": "viewer"}, headers=p.op())
        assert r.status_code == 201
        viewer = r.json()["secret"]

        # Who may do what: tenant keys never work on /admin; viewers only read.
        assert_openai_error(await p.http.get("/admin/cluster", headers=p.op(key)), 401, "authentication_error")
        assert_openai_error(await p.http.get("/admin/cluster"), 401, "authentication_error")
        assert (await p.http.get("/admin/cluster", headers=p.op(viewer))).status_code == 200
        r = await p.http.put("/admin/planner/mode", json={"mode": "manual"}, headers=p.op(viewer))
        assert_openai_error(r, 403, "permission_error", "insufficient_role")
        r = await p.http.post("/admin/tenants", json={"name": "x"}, headers=p.op(viewer))
        assert_openai_error(r, 403, "permission_error")
        # The admin token is no tenant key either.
        assert_openai_error(await p.chat(p.admin_token), 401, "authentication_error")
        # Validation and unknown routes: OpenAI-shaped too.
        r = await p.http.put("/admin/planner/mode", json={"mode": "bogus"}, headers=p.op())
        assert_openai_error(r, 400, "invalid_request_error", "invalid_value")
        assert_openai_error(
            await p.http.get("/admin/nothing", headers=p.op()), 404, "invalid_request_error", "not_found"
        )

        writes = [
            ("put", "/admin/tenants/acme/policy", {"requests_per_minute": 50}, "policy.update"),
            ("patch", "/admin/tenants/acme", {"name": "acme-2"}, "tenant.update"),
            ("put", "/admin/planner/mode", {"mode": "manual"}, "planner.mode"),
            ("put", "/admin/pins/split", {"prefill_nodes": 1}, "pins.split"),
            ("delete", "/admin/pins/split", None, "pins.split.clear"),
            ("put", "/admin/pins/nodes/w1", {"phase": "decode"}, "pins.node"),
            ("delete", "/admin/pins/nodes/w1", None, "pins.node.clear"),
            ("post", "/admin/switch", {"node_id": "w1", "to_phase": "prefill", "reason": "test"}, "switch"),
        ]
        for method, path, body, _ in writes:
            kwargs: dict[str, Any] = {"json": body} if body is not None else {}
            r = await p.http.request(method.upper(), path, headers=p.op(), **kwargs)
            assert r.status_code == 200, (path, r.text)
        expected = [
            "admin_token.bootstrap",
            "tenant.create",
            "api_key.create",
            "admin_token.create",
            *(w[3] for w in writes),
        ]
        actions = await wait_for(lambda: _when_len(audit_actions(), len(expected)))
        assert sorted(actions) == sorted(expected)  # exactly one entry per write, nothing for refusals


async def _when_len(actions: Any, n: int) -> list[str] | None:
    got = await actions
    assert len(got) <= n, got
    return got if len(got) == n else None


async def test_admin_and_planner_switches_recorded_and_overrides_restored(tokenizer, tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    planner = ScriptedPlanner()
    async with product(tokenizer, tmp_path, url, planner=planner) as p:
        token = p.admin_token
        assert p.runtime.cluster.mode is PlannerMode.ADVISORY  # EVOLVING_PLANNER_MODE default
        await asyncio.sleep(0.3)
        assert not planner.done  # advisory: decisions only
        r = await p.http.post(
            "/admin/switch", json={"node_id": "w1", "to_phase": "prefill", "reason": "ops drill"}, headers=p.op()
        )
        assert r.status_code == 200 and r.json()["outcome"] == "ok"
        r = await p.http.put("/admin/planner/mode", json={"mode": "auto"}, headers=p.op())
        assert r.status_code == 200
        await wait_for(lambda: planner.done)

        async def switches() -> list[dict[str, Any]] | None:
            r = await p.http.get("/admin/switches", headers=p.op())
            items = r.json()["items"]
            return items if len(items) >= 2 else None

        items = await wait_for(switches)
        by_who = {i["who"]: i for i in items}
        manual, planned = by_who["bootstrap"], by_who["planner:scripted"]
        assert (manual["node_id"], manual["from_phase"], manual["to_phase"], manual["reason"], manual["outcome"]) == (
            "w1",
            "decode",
            "prefill",
            "ops drill",
            "ok",
        )
        assert (planned["node_id"], planned["to_phase"], planned["outcome"]) == ("w0", "decode", "ok")
        assert planned["reason"] == "planner: scripted move"
        for i in items:
            assert i["total_s"] >= i["drain_s"] >= 0 and i["migrate_s"] >= 0
        r = await p.http.get("/admin/switches", params={"format": "csv"}, headers=p.op())
        assert r.status_code == 200 and "planner:scripted" in r.text
        decisions = await wait_for(lambda: _decisions(p, acted=True))
        assert decisions[0]["planner"] == "scripted" and decisions[0]["mode"] == "auto"
        # Pins to restore at the next start.
        assert (await p.http.put("/admin/planner/mode", json={"mode": "manual"}, headers=p.op())).status_code == 200
        assert (await p.http.put("/admin/pins/nodes/w1", json={"phase": "decode"}, headers=p.op())).status_code == 200
        assert (await p.http.put("/admin/pins/split", json={"prefill_nodes": 1}, headers=p.op())).status_code == 200

    # A restart on the same store: mode and pins come back and are realised (fresh workers
    # start as prefill, decode; w1 is pinned to decode, the split pin wants one prefill node).
    async with product(tokenizer, tmp_path, url, planner=None, admin_token=None) as p2:
        assert p2.cp.first_admin_token is None  # bootstrap happens once
        cluster = p2.runtime.cluster
        assert cluster.mode is PlannerMode.MANUAL and cluster.split_pin == 1 and cluster.node_pins == {"w1": "decode"}
        assert cluster.split() == (1, 1)
        r = await p2.http.get("/admin/pins", headers={"Authorization": f"Bearer {token}"})
        assert r.json() == {"split": 1, "nodes": {"w1": "decode"}}


async def _decisions(p: Product, *, acted: bool) -> list[dict[str, Any]] | None:
    r = await p.http.get("/admin/decisions", params={"acted": str(acted).lower()}, headers=p.op())
    return r.json()["items"] or None


# -- store outage while serving -------------------------------------------------------


@pytest.mark.postgres
async def test_db_outage_keeps_serving_and_usage_arrives_after(tokenizer, tmp_path) -> None:
    with pg_database() as name:
        url = PG_URL.format(host="127.0.0.1", port=5432, name=name)
        async with product(tokenizer, tmp_path, url) as p:
            key = await p.tenant("steady", requests_per_minute=1000)
            assert (await p.chat(key)).status_code == 200  # the gate knows the key now
            assert (await p.http.get("/admin/whoami", headers=p.op())).status_code == 200  # admin token cached
            await wait_for(lambda: p.cp.sink.stats.pending_usage_rows == 0)

            pg_admin(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
            pg_admin(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'")
            try:
                for i in range(6):
                    r = await p.chat(key, branch=f"b{i}", headers={"X-Branch-Finished": "true"})
                    assert r.status_code == 200, r.text
                r = await p.http.post("/admin/switch", json={"node_id": "w1", "to_phase": "prefill"}, headers=p.op())
                assert r.status_code == 200  # control actions work; their records wait
                assert_openai_error(
                    await p.http.get("/admin/switches", headers=p.op()), 503, "server_error", "store_unavailable"
                )
                await wait_for(lambda: p.cp.sink.stats.failed_flushes >= 2)
            finally:
                pg_admin(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')

            def usage_rows() -> list[Any] | None:
                try:
                    rows = p.cp.db.run(lambda s: repository.list_usage(s, tenant_id="steady"))
                except StoreUnavailable:
                    return None
                return rows if sum(r.requests for r in rows) >= 7 else None

            rows = await wait_for(usage_rows)
            assert sum(r.requests for r in rows) == 7  # every request of the outage, none twice
            assert sum(r.completion_tokens for r in rows) == 7 * 4

            async def switch_total() -> bool:
                r = await p.http.get("/admin/switches", headers=p.op())
                return r.status_code == 200 and r.json()["total"] == 1

            await wait_for(switch_total)
            assert p.cp.sink.stats.dropped == 0
