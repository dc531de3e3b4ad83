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
