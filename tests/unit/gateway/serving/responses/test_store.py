"""Stored Responses turns: chains, retention, the LRU bound, tenant scoping."""

from __future__ import annotations

import pytest

from gateway.serving.responses.store import MemoryResponseStore, StoredTurn, conversation


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _turn(rid: str, prev: str | None, text: str, tenant: str = "t") -> StoredTurn:
    return StoredTurn(rid, tenant, prev, [{"role": "user", "content": text}], branch_id="conv")


async def test_a_chain_comes_back_oldest_first() -> None:
    store = MemoryResponseStore(ttl_s=10, max_entries=10)
    await store.put(_turn("r1", None, "a"))
    await store.put(_turn("r2", "r1", "b"))
    await store.put(_turn("r3", "r2", "c"))
    chain = await conversation(store, "t", "r3")
    assert chain is not None and [t.response_id for t in chain] == ["r1", "r2", "r3"]
    assert await conversation(store, "other-tenant", "r3") is None  # another tenant's id is not found


async def test_retention_is_refreshed_by_reading_a_chain() -> None:
    clock = Clock()
    store = MemoryResponseStore(ttl_s=10, max_entries=10, clock=clock)
    await store.put(_turn("r1", None, "a"))
    clock.t = 8
    await store.put(_turn("r2", "r1", "b"))
    assert await conversation(store, "t", "r2") is not None  # walking it refreshes r1 too
    clock.t = 17
    assert await conversation(store, "t", "r2") is not None
    clock.t = 28
    assert await conversation(store, "t", "r2") is None and await store.get("t", "r1") is None


async def test_the_lru_bound_drops_the_least_recently_used() -> None:
    store = MemoryResponseStore(ttl_s=100, max_entries=2)
    await store.put(_turn("r1", None, "a"))
    await store.put(_turn("r2", None, "b"))
    assert await store.get("t", "r1") is not None  # r1 is now the most recent
    await store.put(_turn("r3", None, "c"))
    assert await store.get("t", "r2") is None and await store.get("t", "r1") is not None
    await store.put(_turn("r4", "r2", "d"))
    assert await conversation(store, "t", "r4") is None  # a lost link breaks the chain


async def test_delete() -> None:
    store = MemoryResponseStore(ttl_s=100, max_entries=2)
    await store.put(_turn("r1", None, "a"))
    assert await store.delete("t", "r1") and not await store.delete("t", "r1")


@pytest.mark.redis
async def test_the_redis_store_keeps_chains_with_an_expiry() -> None:
    import uuid

    from gateway.serving.responses.store import RedisResponseStore

    prefix = f"test:responses:{uuid.uuid4().hex}"
    store = RedisResponseStore.from_url("redis://127.0.0.1:6379/0", ttl_s=30, prefix=prefix)
    try:
        await store.put(_turn("r1", None, "a"))
        await store.put(_turn("r2", "r1", "b"))
        chain = await conversation(store, "t", "r2")
        assert chain is not None and [t.messages[0]["content"] for t in chain] == ["a", "b"]
        ttl = await store._r.ttl(f"{prefix}:t:r1")
        assert 0 < ttl <= 30
        assert await store.delete("t", "r1") and await conversation(store, "t", "r2") is None
    finally:
        await store.delete("t", "r2")
        await store.aclose()
