"""Policy enforcement through HTTP: `StoreTenantGate` over a real (SQLite)
store, driven by a minimal OpenAI-style endpoint wired the way the gateway
wires it (authenticate -> branch check -> admit), with an injected clock.
Asserts exact statuses, Retry-After and OpenAI-shaped bodies."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated

import httpx
import pytest
from fastapi import FastAPI, Header
from pydantic import BaseModel

from gateway.http.error_responses import install_error_handlers
from gateway.serving.policy import GateConfig, StoreTenantGate
from gateway.store import Database, EventSink, Policy, repository
from gateway.store.records import UsageRecord


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class ChatBody(BaseModel):
    model: str
    max_tokens: int = 16
    prompt_tokens: int = 10  # stands in for the tokenizer's count


class Harness:
    """A gate, its store and an app with one chat endpoint."""

    def __init__(self, db: Database, config: GateConfig | None = None) -> None:
        self.db = db
        self.clock = FakeClock()
        self.sink = EventSink(db)
        self.gate = StoreTenantGate(db, self.sink, config=config or GateConfig(), clock=self.clock)
        self.active_branches: dict[str, int] = {}
        self.hold = asyncio.Event()
        self.hold.set()
        app = FastAPI()
        install_error_handlers(app)

        @app.post("/v1/chat/completions")
        async def chat(
            body: ChatBody,
            authorization: Annotated[str | None, Header()] = None,
            x_branch_id: Annotated[str | None, Header()] = None,
        ) -> dict[str, object]:
            key = authorization.removeprefix("Bearer ") if authorization else None
            tenant = await self.gate.authenticate(key)
            if x_branch_id is not None:
                self.gate.check_branch_limit(tenant, self.active_branches.get(tenant.tenant_id, 0))
            async with self.gate.admit(
                tenant, model=body.model, prompt_tokens=body.prompt_tokens, max_tokens=body.max_tokens
            ):
                await self.hold.wait()
            self.gate.record_usage(UsageRecord(tenant.tenant_id, body.model, body.prompt_tokens, 0, 1))
            return {"tenant": tenant.tenant_id, "salt": tenant.cache_salt}

        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")

    def tenant(self, name: str, policy: Policy) -> tuple[str, str]:
        """Create a tenant with a key; returns (tenant_id, secret)."""
        with self.db.session() as s:
            t = repository.create_tenant(s, name=name, tenant_id=name, policy=policy)
            _, secret = repository.create_api_key(s, tenant_id=t.id, pepper=self.db.pepper)
        return t.id, secret

    async def chat(
        self, key: str | None, *, model: str = "m", branch: str | None = None, **extra: int
    ) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        if branch:
            headers["X-Branch-ID"] = branch
        return await self.client.post("/v1/chat/completions", json={"model": model, **extra}, headers=headers)


@pytest.fixture
async def h(sqlite_db: Database) -> AsyncIterator[Harness]:
    harness = Harness(sqlite_db)
    yield harness
    await harness.client.aclose()
    await harness.gate.stop()


def assert_error(r: httpx.Response, status: int, type_: str, code: str | None) -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert (err["type"], err["code"]) == (type_, code)
    assert set(err) == {"message", "type", "param", "code"}


async def test_authentication(h: Harness) -> None:
    tenant_id, key = h.tenant("acme", Policy())
    await h.gate.start()
    assert_error(await h.chat(None), 401, "authentication_error", "invalid_api_key")
    assert_error(await h.chat("sk-ei-bogus-key-000000000000"), 401, "authentication_error", "invalid_api_key")
    assert_error(await h.chat(key + "x"), 401, "authentication_error", "invalid_api_key")
    r = await h.chat(key)
    assert r.status_code == 200 and r.json()["tenant"] == tenant_id
    with h.db.session() as s:
        (row,), _ = repository.list_api_keys(s, tenant_id=tenant_id)
        repository.revoke_api_key(s, tenant_id=tenant_id, key_id=row.id)
    assert (await h.chat(key)).status_code == 200  # cached until the next refresh
    await h.gate.refresh()
    assert_error(await h.chat(key), 401, "authentication_error", "invalid_api_key")


async def test_key_created_after_snapshot_is_found(h: Harness) -> None:
    await h.gate.start()
    _, key = h.tenant("late", Policy())
    assert (await h.chat(key)).status_code == 200


async def test_requests_per_minute(h: Harness) -> None:
    _, key = h.tenant("acme", Policy(requests_per_minute=2))
    assert [(await h.chat(key)).status_code for _ in range(2)] == [200, 200]
    r = await h.chat(key)
    assert_error(r, 429, "rate_limit_error", "requests_per_minute_exceeded")
    assert r.headers["Retry-After"] == "60"  # at most 2 in any minute: the first leaves the window at +60 s
    h.clock.t += 59
    assert_error(await h.chat(key), 429, "rate_limit_error", "requests_per_minute_exceeded")
    h.clock.t += 1
    assert (await h.chat(key)).status_code == 200


async def test_tokens_per_minute(h: Harness) -> None:
    _, key = h.tenant("acme", Policy(tokens_per_minute=120))
    assert (await h.chat(key, prompt_tokens=50, max_tokens=50)).status_code == 200
    r = await h.chat(key, prompt_tokens=20, max_tokens=20)  # 20 left, 40 needed: when the 100 leave the window
    assert_error(r, 429, "rate_limit_error", "tokens_per_minute_exceeded")
    assert r.headers["Retry-After"] == "60"
    r = await h.chat(key, prompt_tokens=100, max_tokens=100)
    assert_error(r, 400, "invalid_request_error", "request_exceeds_tokens_per_minute")
    assert "Retry-After" not in r.headers


async def test_max_concurrent(h: Harness) -> None:
    _, key = h.tenant("acme", Policy(max_concurrent=1))
    h.hold.clear()
    first = asyncio.create_task(h.chat(key))
    await asyncio.sleep(0.05)
    r = await h.chat(key)
    assert_error(r, 429, "rate_limit_error", "concurrency_limit_exceeded")
    assert r.headers["Retry-After"] == "1"
    h.hold.set()
    assert (await first).status_code == 200
    assert (await h.chat(key)).status_code == 200


async def test_model_allow_list(h: Harness) -> None:
    _, key = h.tenant("acme", Policy(allowed_models=("small",)))
    assert (await h.chat(key, model="small")).status_code == 200
    r = await h.chat(key, model="large")
    assert_error(r, 403, "permission_error", "model_not_allowed")
    assert r.json()["error"]["param"] == "model"


async def test_branch_limit(h: Harness) -> None:
    tenant_id, key = h.tenant("acme", Policy(max_active_branches=2))
    h.active_branches[tenant_id] = 1
    assert (await h.chat(key, branch="b2")).status_code == 200
    h.active_branches[tenant_id] = 2
    r = await h.chat(key, branch="b3")
    assert_error(r, 429, "rate_limit_error", "branch_limit_exceeded")
    assert r.headers["Retry-After"] == "5"
    assert (await h.chat(key)).status_code == 200  # no new branch: not limited


async def test_limits_are_per_tenant(h: Harness) -> None:
    _, a = h.tenant("a", Policy(requests_per_minute=1))
    _, b = h.tenant("b", Policy(requests_per_minute=1))
    assert (await h.chat(a)).status_code == 200
    assert (await h.chat(a)).status_code == 429
    assert (await h.chat(b)).status_code == 200


async def test_policy_change_applies_after_refresh(h: Harness) -> None:
    tenant_id, key = h.tenant("acme", Policy(requests_per_minute=1))
    await h.gate.start()
    assert (await h.chat(key)).status_code == 200
    assert (await h.chat(key)).status_code == 429
    with h.db.session() as s:
        repository.put_policy(s, tenant_id=tenant_id, policy=Policy(requests_per_minute=1000))
    await h.gate.refresh()
    h.clock.t += 0.1  # the bucket keeps its fill; the new rate refills it fast
    assert (await h.chat(key)).status_code == 200


async def test_cache_salt_follows_isolation(h: Harness) -> None:
    _, iso = h.tenant("iso", Policy())
    _, shared = h.tenant("shared", Policy(cache_isolation=False))
    _, iso2 = h.tenant("iso2", Policy())
    salts = [(await h.chat(k)).json()["salt"] for k in (iso, shared, iso2)]
    assert salts[0] and salts[2] and salts[0] != salts[2]
    assert salts[1] == ""


async def test_priority_order_when_saturated(sqlite_db: Database) -> None:
    h = Harness(sqlite_db, GateConfig(global_max_concurrent=1, admission_wait_s=5.0))
    _, low = h.tenant("low", Policy(priority=3))
    _, high = h.tenant("high", Policy(priority=0))
    h.hold.clear()
    holder = asyncio.create_task(h.chat(low))
    await asyncio.sleep(0.05)
    done: list[str] = []

    async def call(name: str, key: str) -> None:
        r = await h.chat(key)
        assert r.status_code == 200
        done.append(name)

    waiters = [asyncio.create_task(call("low", low))]
    await asyncio.sleep(0.05)
    waiters.append(asyncio.create_task(call("high", high)))
    await asyncio.sleep(0.05)
    assert h.gate.admission.waiting == 2
    h.hold.set()
    await asyncio.gather(holder, *waiters)
    assert done == ["high", "low"]
    await h.client.aclose()


async def test_saturated_wait_is_bounded(sqlite_db: Database) -> None:
    h = Harness(sqlite_db, GateConfig(global_max_concurrent=1, admission_wait_s=0.1))
    _, key = h.tenant("t", Policy(requests_per_minute=10))
    h.hold.clear()
    holder = asyncio.create_task(h.chat(key))
    await asyncio.sleep(0.05)
    r = await h.chat(key)
    assert_error(r, 429, "rate_limit_error", "cluster_saturated")
    assert "Retry-After" in r.headers
    h.hold.set()
    assert (await holder).status_code == 200
    await h.client.aclose()


async def test_usage_goes_through_the_sink(h: Harness) -> None:
    tenant_id, key = h.tenant("acme", Policy())
    for _ in range(3):
        assert (await h.chat(key, prompt_tokens=7)).status_code == 200
    assert h.sink.stats.pending_usage_rows == 1
    assert await h.sink.flush()
    with h.db.session() as s:
        (row,) = repository.list_usage(s, tenant_id=tenant_id)
    assert (row.requests, row.prompt_tokens, row.completion_tokens) == (3, 21, 3)


async def test_a_revoke_notice_drops_a_key_already_matched(h: Harness) -> None:
    """The gate remembers matched keys per snapshot; a revoke notice (or a
    deleted tenant) empties that memory at once, with no refresh."""
    tenant_id, key = h.tenant("acme", Policy())
    other_id, other = h.tenant("beta", Policy())
    await h.gate.start()
    assert (await h.chat(key)).status_code == 200
    assert (await h.chat(key)).status_code == 200  # matched from memory
    with h.db.session() as s:
        (row,), _ = repository.list_api_keys(s, tenant_id=tenant_id)
    assert h.gate.forget_key(row.id)
    assert_error(await h.chat(key), 401, "authentication_error", "invalid_api_key")
    assert (await h.chat(other)).status_code == 200
    h.gate.forget_tenant(other_id)
    assert_error(await h.chat(other), 401, "authentication_error", "invalid_api_key")
