"""Three gateway replicas as separate processes on the real PostgreSQL and Redis,
in front of four fake workers (processes speaking the worker protocol, with
fencing): one planner leader, failover, fencing of a paused leader, overrides
and revocation on every replica within 1 s, limits across replicas."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from functools import partial
from typing import Any

import httpx
import pytest

from testing.replica_cluster import ReplicaCluster, pg_available, redis_available, wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.redis]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReplicaCluster]:
    if not pg_available() or not redis_available("redis://127.0.0.1:6379/0"):
        pytest.skip("needs PostgreSQL on 127.0.0.1:5432 and Redis on 127.0.0.1:6379")
    c = ReplicaCluster(
        tmp_path_factory.mktemp("replicas"),
        replicas=3,
        phases=("decode", "decode", "decode", "decode"),
        switch_delay_s=1.0,  # a switch order takes a second: a leader can be paused in the middle of a batch
        env={"EVOLVING_PLANNER_MODE": "advisory", "EVOLVING_PLANNER_INTERVAL_S": "0.25"},
    )
    try:
        c.start()
        yield c
    finally:
        c.close()


def test_exactly_one_leader_and_followers_show_its_decision(cluster: ReplicaCluster) -> None:
    leader = cluster.wait_leader()
    states = [cluster.planner(i) for i in range(3)]
    assert [s["leadership"]["leading"] for s in states].count(True) == 1
    name = f"g{leader}"
    assert {s["leadership"]["leader"] for s in states} == {name}
    assert len({s["leadership"]["term"] for s in states}) == 1
    # followers show the leader's decision (read from the store), none of their own
    follower = next(i for i in range(3) if i != leader)
    decision = wait_until(lambda: cluster.planner(follower)["last_decision"], 10, what="the leader's decision")
    assert decision["planner"] == "evolving"
    recent = cluster.admin(leader, "GET", "/decisions?limit=50").json()["items"]
    assert recent and all(d["mode"] == "advisory" for d in recent)


def _mode_is(cluster: ReplicaCluster, replica: int, mode: str) -> bool:
    return bool(cluster.planner(replica)["mode"] == mode)


def _split_pin_is(cluster: ReplicaCluster, replica: int, split: int | None) -> bool:
    return bool(cluster.admin(replica, "GET", "/pins").json()["split"] == split)


def _refused(cluster: ReplicaCluster, replica: int, key: str) -> bool:
    return cluster.chat(replica, key).status_code == 401


def test_mode_and_pins_reach_every_replica_within_1s(cluster: ReplicaCluster) -> None:
    for via, mode in ((0, "manual"), (2, "advisory")):
        r = cluster.admin(via, "PUT", "/planner/mode", {"mode": mode})
        assert r.status_code == 200
        t = time.monotonic()
        for i in range(3):
            wait_until(partial(_mode_is, cluster, i, mode), 1.0, what=f"mode {mode} on g{i}")
        assert time.monotonic() - t <= 1.0
    # a split pin that needs no switch (every node is a decode node), set through a follower
    leader = cluster.wait_leader()
    via = (leader + 1) % 3
    assert cluster.admin(via, "PUT", "/pins/split", {"prefill_nodes": 0}).json()["split"] == 0
    for i in range(3):
        wait_until(partial(_split_pin_is, cluster, i, 0), 1.0, what=f"pin on g{i}")
    assert cluster.admin(leader, "DELETE", "/pins/split").json()["split"] is None
    for i in range(3):
        wait_until(partial(_split_pin_is, cluster, i, None), 1.0, what=f"unpin on g{i}")


def test_revoked_key_refused_by_every_replica_within_1s(cluster: ReplicaCluster) -> None:
    key = cluster.tenant("revoked", via=0)
    assert [cluster.chat(i, key).status_code for i in range(3)] == [200, 200, 200]
    key_id = cluster.admin(0, "GET", "/tenants/revoked/keys").json()["items"][0]["id"]
    r = cluster.admin(1, "DELETE", f"/tenants/revoked/keys/{key_id}")
    assert r.status_code == 200
    revoked_at = time.monotonic()
    for i in range(3):
        wait_until(partial(_refused, cluster, i, key), 1.0, every_s=0.01, what=f"401 on g{i}")
    assert time.monotonic() - revoked_at <= 1.0
    # deleting a tenant is the same notice: its other keys stop everywhere
    other = cluster.tenant("deleted", via=2)
    assert cluster.chat(0, other).status_code == 200
    assert cluster.admin(2, "DELETE", "/tenants/deleted").status_code == 204
    for i in range(3):
        wait_until(partial(_refused, cluster, i, other), 1.0, every_s=0.01, what=f"deleted on g{i}")


def test_limits_hold_across_replicas(cluster: ReplicaCluster) -> None:
    key = cluster.tenant("rpm30", {"requests_per_minute": 30})
    codes = [cluster.chat(i % 3, key).status_code for i in range(75)]
    assert codes.count(200) == 30 and codes.count(429) == 45  # one budget, not 30 per replica
    assert codes[:30] == [200] * 30
    # concurrency: two slow requests in flight on two replicas; a third on the third replica waits its turn
    slow = cluster.tenant("conc2", {"max_concurrent": 2})
    with httpx.Client(timeout=30) as h:
        import concurrent.futures as cf

        body = {"model": "demo", "messages": [{"role": "user", "content": "x"}], "max_tokens": 150}
        auth = {"Authorization": f"Bearer {slow}"}
        with cf.ThreadPoolExecutor(2) as pool:
            running = [
                pool.submit(h.post, f"{cluster.gateways[i].url}/v1/chat/completions", json=body, headers=auth)
                for i in (0, 1)
            ]
            time.sleep(0.4)  # both admitted, decoding (150 tokens at 5 ms)
            third = h.post(f"{cluster.gateways[2].url}/v1/chat/completions", json=body, headers=auth)
            assert third.status_code == 429 and third.json()["error"]["code"] == "concurrency_limit_exceeded"
            assert [f.result().status_code for f in running] == [200, 200]
        assert cluster.chat(2, slow).status_code == 200  # the slots came back


def _node_on(cluster: ReplicaCluster, replica: int, node_id: str) -> dict[str, Any]:
    nodes = cluster.admin(replica, "GET", "/cluster").json()["nodes"]
    return next(n for n in nodes if n["node_id"] == node_id)


def _split_is(cluster: ReplicaCluster, replica: int, split: list[int]) -> bool:
    return bool(cluster.admin(replica, "GET", "/cluster").json()["split"] == split)


def _draining_on(cluster: ReplicaCluster, replica: int, node_id: str, to: str) -> bool:
    return bool(_node_on(cluster, replica, node_id)["draining_to"] == to)


def _settled_on(cluster: ReplicaCluster, replica: int, node_id: str, phase: str) -> bool:
    node = _node_on(cluster, replica, node_id)
    return bool(node["phase"] == phase and node["draining_to"] is None)


def test_every_replica_follows_the_leaders_switch(cluster: ReplicaCluster) -> None:
    leader = cluster.wait_leader()
    followers = [i for i in range(3) if i != leader]
    for to in ("prefill", "decode"):  # there and back: the next test starts from every node decode
        order = {"node_id": "w3", "to_phase": to, "reason": "test"}
        switching = threading.Thread(target=partial(cluster.admin, leader, "POST", "/switch", order), daemon=True)
        switching.start()
        for i in followers:  # a follower learns of the drain from the worker's heartbeat (every 0.2 s; it takes 1 s)
            wait_until(partial(_draining_on, cluster, i, "w3", to), 3, what=f"the drain on g{i}")
        switching.join(10)
        for i in range(3):  # ... and of its end the same way
            wait_until(partial(_settled_on, cluster, i, "w3", to), 3, what=f"w3 {to} on g{i}")


def test_a_paused_leaders_orders_are_refused(cluster: ReplicaCluster) -> None:
    old = cluster.wait_leader()
    term = cluster.planner(old)["leadership"]["term"]
    # Pin 3 prefill nodes: the leader realises it with 3 switches, one after the other (1 s each).
    threading.Thread(
        target=lambda: cluster.admin(old, "PUT", "/pins/split", {"prefill_nodes": 3}, timeout_s=60), daemon=True
    ).start()
    wait_until(lambda: any(s["draining_to"] for s in cluster.worker_stats()), 10, what="the first switch started")
    cluster.gateways[old].signal(signal.SIGSTOP)
    paused_at = time.time()
    try:
        others = [i for i in range(3) if i != old]
        new = cluster.wait_leader(among=others, timeout_s=10)
        new_term = cluster.planner(new)["leadership"]["term"]
        assert new_term > term
        wait_until(lambda: all(s["fence_term"] >= new_term for s in cluster.worker_stats()), 5, what="term announced")
    finally:
        cluster.gateways[old].signal(signal.SIGCONT)
    resumed_at = time.time()
    # the resumed leader finishes its first order, sends the next with its old term, is refused, steps down
    wait_until(lambda: sum(s["refused_orders"] for s in cluster.worker_stats()) >= 1, 10, what="a refused order")
    wait_until(lambda: not cluster.planner(old)["leadership"]["leading"], 5, what="the old leader stepped down")
    assert cluster.leaders() == [new]
    stale = [s for node in cluster.worker_switches() for s in node if s["term"] is not None and s["term"] < new_term]
    assert all(s["t"] < resumed_at for s in stale), stale  # no order of the old term carried out after it resumed
    assert all(s["t"] < paused_at + 0.5 for s in stale), stale
    # the new leader realised the pin
    wait_until(partial(_split_is, cluster, new, [3, 1]), 15, what="split 3/1")
    # every replica sees it: a drain another replica drove ends with the worker's report, not with a switch of its own
    for i in range(3):
        wait_until(partial(_split_is, cluster, i, [3, 1]), 5, what=f"3/1 on g{i}")
    fenced = wait_until(
        lambda: cluster.admin(new, "GET", "/switches?outcome=fenced").json()["items"], 5, what="the fenced switch"
    )
    assert "stale_term" in fenced[0]["detail"]
    assert cluster.admin(new, "DELETE", "/pins/split").status_code == 200


def test_leader_kill_fails_over_within_5s(cluster: ReplicaCluster) -> None:
    old = cluster.wait_leader()
    cluster.gateways[old].kill()
    killed_at = time.time()
    others = [i for i in range(3) if i != old]
    new = cluster.wait_leader(among=others, timeout_s=10)

    def new_decision() -> float | None:
        d = cluster.planner(new)["last_decision"]
        return d["t"] if d and d["t"] > killed_at else None

    first = wait_until(new_decision, 10, what="the new leader's first decision")
    assert first - killed_at <= 5.0
    assert cluster.leaders(others) == [new]
    cluster.respawn(old)
    time.sleep(1.0)
    assert cluster.leaders() == [new]  # the restarted replica follows
    assert cluster.planner(old)["leadership"]["leader"] == f"g{new}"
