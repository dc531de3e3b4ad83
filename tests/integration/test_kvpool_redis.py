"""The directory contract on a real Redis (127.0.0.1:6379) through the async
backend, plus replica sharing."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio as aioredis

from kvpool.directory import BlockDirectory, DirectoryUnavailable
from kvpool.directory.redis_backend import AsyncRedisDirectory
from testing.blocking_directory import BlockingDirectory
from testing.directory_contract import BB, DirectoryContract, H

pytestmark = pytest.mark.redis

URL = "redis://127.0.0.1:6379/0"
_open: list[BlockingDirectory] = []


def _fresh(prefix: str, url: str = URL) -> BlockingDirectory:
    try:
        redis.Redis.from_url(URL).ping()
    except redis.ConnectionError:
        pytest.skip("no Redis server on 127.0.0.1:6379")
    d = BlockingDirectory(lambda: AsyncRedisDirectory.from_url(url, prefix))
    _open.append(d)
    return d


@pytest.fixture
def prefix() -> Iterator[str]:
    p = f"{{kvpool-test-{uuid.uuid4().hex[:10]}}}"
    yield p
    _fresh(p).clear()
    while _open:
        _open.pop().close()


class TestRedisDirectory(DirectoryContract):
    @pytest.fixture
    def directory(self, prefix: str) -> BlockDirectory:
        return _fresh(prefix)


def test_two_replicas_share_one_directory(prefix: str) -> None:
    a, b = _fresh(prefix), _fresh(prefix)
    a.publish("n1", [(H[0], 4)], BB, now=1.0)
    a.open_branch("br", "t", now=1.0)
    b.reference("br", [H[0]], now=2.0)
    assert b.longest_prefix([H[0]]).per_node_blocks == {"n1": 1}
    assert a.ref_counts([H[0]]) == [1]
    assert b.finish_branch("br") is not None and a.finish_branch("br") is None
    assert a.ref_counts([H[0]]) == [0]


def test_concurrent_replicas_count_exactly(prefix: str) -> None:
    replicas = [_fresh(prefix) for _ in range(4)]
    for i in range(8):
        replicas[0].open_branch(f"b{i}", "t", now=1.0)

    def work(d: BlockingDirectory, k: int) -> None:
        for i in range(k, 8, 4):
            for _ in range(3):  # repeated references count once per branch
                d.reference(f"b{i}", H[:10], now=2.0)

    threads = [threading.Thread(target=work, args=(d, k)) for k, d in enumerate(replicas)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert replicas[1].ref_counts(H[:10]) == [8] * 10
    for i in range(8):
        replicas[i % 4].finish_branch(f"b{i}")
    assert replicas[2].ref_counts(H[:10]) == [0] * 10
    st = replicas[3].stats()
    assert (st.referenced_blocks, st.active_branches) == (0, 0)


def test_the_branch_cap_holds_across_racing_replicas(prefix: str) -> None:
    from kvpool.directory import BranchLimitReached

    replicas = [_fresh(prefix) for _ in range(4)]
    opened: list[str] = []

    def work(d: BlockingDirectory, k: int) -> None:
        for i in range(5):
            try:
                d.open_branch(f"r{k}-{i}", "t", now=1.0, max_active=7)
                opened.append(f"r{k}-{i}")
            except BranchLimitReached:
                pass

    threads = [threading.Thread(target=work, args=(d, k)) for k, d in enumerate(replicas)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(opened) == 7 and replicas[0].active_branch_count("t") == 7


def test_expire_loses_to_a_concurrent_touch(prefix: str) -> None:
    a, b = _fresh(prefix), _fresh(prefix)
    a.open_branch("br", "t", now=0.0)
    b.touch("br", now=99.0)  # another replica saw a request just now
    assert a.expire(now=100.0, idle_ttl_s=10.0) == []
    assert a.branch("br") is not None


def test_clear_removes_every_key(prefix: str) -> None:
    d = _fresh(prefix)
    d.publish("n1", [(H[0], 0)], BB, now=1.0)
    d.open_branch("b", "t", now=1.0)
    d.reference("b", [H[0]], now=1.0)
    assert d.clear() > 0
    client = redis.Redis.from_url(URL, decode_responses=True)
    assert list(client.scan_iter(match=prefix + ":*")) == []


async def test_an_unreachable_redis_is_directory_unavailable() -> None:
    d = AsyncRedisDirectory.from_url("redis://127.0.0.1:9/0", "{nowhere}", socket_timeout_s=0.5)
    with pytest.raises(DirectoryUnavailable):
        await d.longest_prefix([H[0]])
    with pytest.raises(DirectoryUnavailable):
        await d.open_branch("b", "t", now=1.0)


def test_requires_decoded_responses() -> None:
    with pytest.raises(ValueError, match="decode_responses=True"):
        AsyncRedisDirectory(aioredis.Redis.from_url(URL))


async def test_opening_a_branch_and_a_lookup_are_one_round_trip_each(prefix: str) -> None:
    """What the request path pays in Redis: opening a branch returns it as
    its script read it, and a lookup's counters ride with its reads; the
    blocks a lookup hit go with the next one, and `stats` (or
    `flush_stats`, when a replica stops) sends them first, so none is lost."""
    _fresh(prefix)  # skips without Redis; the fixture clears the prefix after
    d = AsyncRedisDirectory.from_url(URL, prefix)
    pool = d._r.connection_pool
    taken = 0
    get_connection = pool.get_connection

    async def counted(*args: object, **kwargs: object) -> object:  # one per command or pipeline sent
        nonlocal taken
        taken += 1
        return await get_connection(*args, **kwargs)

    pool.get_connection = counted  # type: ignore[method-assign]  # counting the round trips
    try:
        await d.publish("n1", [(H[0], 4), (H[1], 5)], BB, now=1.0)
        await d.open_branch("warm", "t", now=1.0)  # the scripts loaded, if this Redis had none
        taken = 0
        info = await d.open_branch("b", "t", now=2.0, parent_id="p", session_id="s")
        assert taken == 1
        assert (info.tenant_id, info.parent_id, info.session_id, info.opened_at, info.num_blocks) == (
            "t",
            "p",
            "s",
            2.0,
            0,
        )
        await d.reference("b", [H[0]], now=3.0)
        again = await d.open_branch("b", "t", now=4.0)  # an open branch is touched, and read back
        assert (again.opened_at, again.last_active_at, again.num_blocks) == (2.0, 4.0, 1)
        taken = 0
        assert (await d.longest_prefix([H[0], H[1], H[2]])).num_blocks == 2
        assert (await d.longest_prefix([H[1]])).num_blocks == 1
        assert taken == 2
        raw = redis.Redis.from_url(URL, decode_responses=True)
        assert raw.hgetall(prefix + ":stats") == {"lookups": "2", "looked_up_blocks": "4", "hit_blocks": "2"}
        await d.flush_stats()
        assert raw.hget(prefix + ":stats", "hit_blocks") == "3"
        await d.longest_prefix([H[0]])
        st = await d.stats()
        assert (st.lookups, st.looked_up_blocks, st.hit_blocks) == (3, 5, 4)
    finally:
        await d._r.aclose()
