"""GatewayDirectory when its backend is unreachable: no cache hit, no error,
branch caps as "limit / replicas" on this replica's own branches."""

from __future__ import annotations

from gateway.kv.circuit import CircuitBreaker
from gateway.kv.directory import GatewayDirectory
from testing.fake_directory import FlakyDirectory
from workers.protocol import BlockLocation

TOKENS = list(range(64))


def directory(replicas: int = 1) -> tuple[GatewayDirectory, FlakyDirectory, list[float]]:
    backend, now = FlakyDirectory(), [0.0]
    d = GatewayDirectory(
        backend,
        block_size=16,
        breaker=CircuitBreaker(initial_s=1.0, max_s=4.0),
        replicas=lambda: replicas,
        monotonic=lambda: now[0],
    )
    return d, backend, now


async def test_an_outage_loses_cache_hits_never_the_request() -> None:
    d, backend, now = directory()
    hashes = d.block_hashes(TOKENS, "s")
    await d.publish("n1", [BlockLocation(block_hash=h, node_id="n1", slot=i) for i, h in enumerate(hashes)], 4096)
    assert (await d.lookup(TOKENS, "s")).pool_cached_tokens == 64
    backend.down = True
    miss = await d.lookup(TOKENS, "s")
    assert miss.pool_cached_tokens == 0 and miss.block_hashes == hashes
    calls = backend.calls
    assert (await d.lookup(TOKENS, "s")).pool_cached_tokens == 0
    await d.publish("n1", [], 4096)
    await d.reference("t/b", hashes)
    assert backend.calls == calls  # the circuit is open: nobody waits on the backend
    assert not (await d.stats()).available and d.unavailable >= 4
    backend.down = False
    now[0] = 1.0  # the backoff is over: the next call probes and closes the circuit
    assert (await d.lookup(TOKENS, "s")).pool_cached_tokens == 64
    assert d.backend_available and (await d.stats()).available


async def test_branch_cap_during_an_outage_is_the_share_of_this_replica() -> None:
    d, backend, _ = directory(replicas=2)
    assert await d.open_branch("t/a", tenant_id="t", max_active_branches=4)
    backend.down = True
    # cap 4 over 2 replicas: this replica may hold 2 (it holds 1, opened before the outage)
    assert await d.open_branch("t/b", tenant_id="t", max_active_branches=4)
    assert not await d.open_branch("t/c", tenant_id="t", max_active_branches=4)
    assert await d.open_branch("t/a", tenant_id="t", max_active_branches=4)  # an open one re-opens
    assert await d.active_branch_count("t") == 4  # 2 of its own, times 2 replicas
    assert await d.is_branch_active("t/b") and await d.finish_branch("t/b")
    assert not await d.is_branch_active("t/b")
    assert await d.open_branch("t/c", tenant_id="t", max_active_branches=4)


async def test_the_cap_is_atomic_in_the_backend() -> None:
    d, _, _ = directory()
    assert await d.open_branch("t/a", tenant_id="t", max_active_branches=1)
    assert not await d.open_branch("t/b", tenant_id="t", max_active_branches=1)
    assert await d.active_branch_count("t") == 1


def test_block_hashes_are_the_pools_whatever_is_known() -> None:
    from kvpool.hashing import block_hashes

    d, _, _ = directory()
    for n in (0, 5, 15, 16, 17, 31, 32, 40, 64):
        tokens = TOKENS[:n]
        want = block_hashes(tokens, 16, "s")
        assert d.block_hashes(tokens, "s") == want
        for k in range(len(want) + 1):  # every prefix of the answer reused, the whole answer included
            known = want[:k]
            got = d.block_hashes(tokens, "s", known=known)
            assert got == want and got is not known  # a list of its own, not the caller's
    assert d.block_hashes(TOKENS[:15], "s") == []  # under one block: no hash
