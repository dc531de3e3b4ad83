"""Redis goes away under traffic: two gateway replicas as separate processes
on the real PostgreSQL and a Redis server of the test's own (killed and
restarted empty), in front of two fake workers.

The documented policy (docs/operations.md, "When Redis is unreachable"): no
request fails because of it, serving continues, and each replica enforces
limit / replicas of a tenant's limit, counting what it admitted in the
minute before; after Redis returns the limit still holds (the replicas put
their minute back into the shared windows), never unlimited."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from testing.redis_server import OwnRedis
from testing.replica_cluster import ReplicaCluster, pg_available, wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.redis]


@pytest.fixture(scope="module")
def outage(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ReplicaCluster, OwnRedis]]:
    if not pg_available():
        pytest.skip("needs PostgreSQL on 127.0.0.1:5432")
    server = OwnRedis().start()
    c = ReplicaCluster(
        tmp_path_factory.mktemp("outage"),
        replicas=2,
        phases=("decode", "decode"),
        redis_url=server.url,
        env={"EVOLVING_PLANNER_MODE": "advisory"},
    )
    try:
        c.start()
        yield c, server
    finally:
        c.close()
        server.stop()


def test_redis_outage_keeps_serving_and_limits_follow_the_local_share(
    outage: tuple[ReplicaCluster, OwnRedis],
) -> None:
    cluster, server = outage
    limited = cluster.tenant("limited", {"requests_per_minute": 20})
    free = cluster.tenant("free")
    codes: list[int] = []

    def send(i: int, key: str, branch: str | None = None) -> int:
        code = cluster.chat(i % 2, key, branch=branch, max_tokens=2).status_code
        codes.append(code)
        return code

    # The share divides by the replicas each one last counted in Redis (a heartbeat
    # every second): wait until both are registered, then one more beat, so that the
    # first replica up has counted the second too (it counted only itself at start).
    r = redis.Redis.from_url(server.url, socket_timeout=2)
    wait_until(lambda: r.zcard(f"{cluster.redis_base}:replicas") == 2, 15, every_s=0.1, what="both replicas registered")
    time.sleep(1.5)
    # before: in Redis, 3 on each replica
    assert [send(i, limited) for i in range(6)] == [200] * 6
    server.stop()
    # during: each replica may admit its share, 20 / 2 = 10 a minute, counting its 3 from before
    during = [send(i, limited) for i in range(40)]
    assert during.count(200) == 14 and during.count(429) == 26
    # serving continues, with branches too (the directory answers "no cache hit")
    assert [send(i, free, branch=f"b{i}") for i in range(10)] == [200] * 10
    server.start()  # empty, like a Redis without persistence

    def healed() -> bool:
        return send(0, free, branch="after") == 200 and send(1, free, branch="after") == 200

    wait_until(healed, 15, every_s=0.2, what="serving through Redis again")
    # Each replica's background probe replays its minute (every recover_s, 0.5 s;
    # a probe that meets a connection the restart broke fails and the next one
    # replays): wait until both minutes are back, 3 + 7 admissions each.
    window = f"{cluster.redis_base}:lim:limited:req"
    wait_until(lambda: r.zcard(window) == 20, 10, every_s=0.1, what="both replicas' minutes replayed")
    # the minute's 20 admissions were put back into Redis: still refused, never unlimited
    assert [send(i, limited) for i in range(6)] == [429] * 6
    assert not [c for c in codes if c >= 500]
