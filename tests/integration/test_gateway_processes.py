"""`evolving-infra gateway --workers 2`: two gateway processes on one port,
on the real PostgreSQL and Redis, in front of two fake workers. They are
two replicas of one cluster: both registered in Redis, one planner leader
between them, one tenant limit across both."""

from __future__ import annotations

import pathlib

import pytest
import redis

from testing.replica_cluster import ReplicaCluster, pg_available, redis_available, wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.redis]
REDIS = "redis://127.0.0.1:6379/0"


def test_two_processes_on_one_port_act_as_two_replicas_of_one_cluster(tmp_path: pathlib.Path) -> None:
    if not pg_available() or not redis_available(REDIS):
        pytest.skip("needs PostgreSQL on 127.0.0.1:5432 and Redis on 127.0.0.1:6379")
    c = ReplicaCluster(
        tmp_path, replicas=1, processes=2, phases=("decode", "decode"), env={"EVOLVING_PLANNER_MODE": "advisory"}
    )
    try:
        c.start()
        members = redis.Redis.from_url(REDIS, decode_responses=True)
        wait_until(lambda: members.zcard(c.redis_base + ":replicas") == 2, 15, what="both processes registered")
        # Many connections: the kernel spreads them over both processes; exactly one leads.
        seen: dict[str, bool] = {}
        for _ in range(40):
            lead = c.planner(0)["leadership"]
            seen[lead["replica"]] = lead["leading"]
        assert len(seen) == 2 and sorted(seen.values()) == [False, True], seen
        key = c.tenant("limited", {"requests_per_minute": 10})
        answers = [c.chat(0, key, max_tokens=1) for _ in range(16)]
        codes = [r.status_code for r in answers]
        assert codes.count(200) == 10 and codes.count(429) == 6  # one limit across both processes
        # Each process serves as one gateway does (gateway.http.server.server_options): no `server` header.
        assert all("server" not in r.headers for r in answers)
    finally:
        c.close()
