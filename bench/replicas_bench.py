"""`evolving-infra bench replicas`: several gateway replicas acting as one cluster brain.

Three gateway replicas run as separate processes (`evolving-infra gateway`,
as an operator runs them) on the real PostgreSQL (a fresh database) and
Redis (a fresh key namespace), in front of **fake workers**: processes
speaking the worker protocol without a model (`testing.fake_worker_app`,
fencing included), so the numbers are the gateway's, not inference's.
Agent traffic goes round-robin across the replicas: every turn of a branch
to the next replica. Prints one JSON object:

- `leaders_max`: the most replicas that reported themselves leading in one
  poll of all replicas (every 50 ms through the whole run; must be 1);
- `estimate_error`: relative difference between the leader's offered-rate
  estimate (`inputs.offered_rate_rps` of its latest decision) and that of a
  single gateway on the same trace (target <= 0.05); `estimate_parts` gives
  the served rate and mean tokens too;
- `limit_admitted_ratio`: admitted / 60 for a tenant at 60 requests/min
  sending 200 requests spread over `--limit-s` seconds across the replicas
  (target 0.95-1.05);
- `override_propagation_s`: p99 time from an admin write sent to one replica
  to its effect seen on another, over key revocation, pin and mode changes
  (target <= 1.0);
- `failover_s`: leader killed (SIGKILL) -> first decision of the new leader
  (target <= 5);
- `stale_orders_refused`: orders of the old term the workers refused after
  the leader was paused (SIGSTOP) in the middle of a batch of switches,
  another replica took over, and it was resumed (SIGCONT) (>= 1), and
  `stale_orders_carried_out` (must be 0);
- `rps_1_process`, `rps_n_processes`: completed requests/s through one
  gateway with 1 and with N processes (`gateway --workers N`, N = the CPU
  count) on this machine, same fake workers, same client.

    evolving-infra bench replicas --json [--replicas 3] [--agents 12] [--turns 8] [--keep DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import pathlib
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

from testing.replica_cluster import ReplicaCluster, pg_available, redis_available, wait_until

REDIS = "redis://127.0.0.1:6379/0"
LONG = "The tool returned a long listing of files, their sizes and their owners. " * 6
SHORT = "ok"


# -- agent traffic --------------------------------------------------------------------
async def run_agents(cluster: ReplicaCluster, key: str, *, agents: int, turns: int, think_s: float) -> dict[str, Any]:
    """Closed-loop agents: each sends a turn, waits for it, thinks, sends the next
    (a growing prompt) to the next replica in turn; half send long tool results."""
    urls = [g.url for g in cluster.gateways]
    codes: list[int] = []

    async def agent(i: int, h: httpx.AsyncClient) -> None:
        messages: list[dict[str, str]] = [{"role": "system", "content": f"You are agent {i}."}]
        tool = LONG if i % 2 else SHORT
        for t in range(turns):
            messages.append({"role": "user", "content": f"Step {t}: {tool}"})
            headers = {"Authorization": f"Bearer {key}", "X-Branch-ID": f"agent-{i}"}
            if t == turns - 1:
                headers["X-Branch-Finished"] = "true"
            body = {"model": "demo", "messages": messages, "max_tokens": 16 if i % 2 else 48}
            r = await h.post(f"{urls[(i + t) % len(urls)]}/v1/chat/completions", json=body, headers=headers)
            codes.append(r.status_code)
            if r.status_code == 200:
                messages.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
            await asyncio.sleep(think_s)

    t0 = time.monotonic()
    async with httpx.AsyncClient(timeout=60) as h:
        await asyncio.gather(*(agent(i, h) for i in range(agents)))
    return {"requests": len(codes), "ok": codes.count(200), "seconds": round(time.monotonic() - t0, 2)}


def latest_inputs(cluster: ReplicaCluster, leader: int, after: float) -> dict[str, float]:
    def fresh() -> dict[str, float] | None:
        d = cluster.planner(leader)["last_decision"]
        return d["inputs"] if d and d["t"] > after else None

    return dict(wait_until(fresh, 15, every_s=0.1, what="a decision after the trace"))


def estimate_run(cluster: ReplicaCluster, args: argparse.Namespace) -> tuple[dict[str, float], dict[str, Any]]:
    key = cluster.tenant("agents")
    traffic = asyncio.run(run_agents(cluster, key, agents=args.agents, turns=args.turns, think_s=args.think_s))
    time.sleep(1.0)  # the last samples reach the stream, then one more tick
    leader = cluster.wait_leader()
    return latest_inputs(cluster, leader, time.time()), traffic


# -- leaders at once, all run long ----------------------------------------------------------
class LeaderWatch:
    def __init__(self, cluster: ReplicaCluster) -> None:
        self.cluster = cluster
        self.max_leading = 0
        self.per_term: dict[int, set[str]] = {}
        self.rounds = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=0.5, headers={"Authorization": f"Bearer {self.cluster.admin_token}"}) as h:
            while not self._stop.is_set():
                leading = 0
                for g in self.cluster.gateways:
                    if not g.alive:
                        continue
                    try:
                        lead = h.get(f"{g.url}/admin/planner").json().get("leadership") or {}
                    except (httpx.HTTPError, ValueError):
                        continue  # paused or restarting
                    if lead.get("leading"):
                        leading += 1
                        self.per_term.setdefault(int(lead["term"]), set()).add(str(lead["replica"]))
                self.max_leading = max(self.max_leading, leading)
                self.rounds += 1
                self._stop.wait(0.05)

    def __enter__(self) -> LeaderWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


# -- limits ----------------------------------------------------------------------------------
def limit_run(cluster: ReplicaCluster, seconds: float, sent: int = 200, rpm: int = 60) -> dict[str, Any]:
    key = cluster.tenant("limited", {"requests_per_minute": rpm})
    codes: list[int] = []
    t0 = time.monotonic()
    with httpx.Client(timeout=30) as h:
        for i in range(sent):
            while time.monotonic() < t0 + i * seconds / sent:
                time.sleep(0.001)
            r = h.post(
                f"{cluster.gateways[i % len(cluster.gateways)].url}/v1/chat/completions",
                json={"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
                headers={"Authorization": f"Bearer {key}"},
            )
            codes.append(r.status_code)
    return {
        "sent": sent,
        "admitted": codes.count(200),
        "refused_429": codes.count(429),
        "errors_5xx": sum(1 for c in codes if c >= 500),
        "seconds": round(time.monotonic() - t0, 1),
        "ratio": codes.count(200) / rpm,
    }


# -- overrides -------------------------------------------------------------------------------
def _put_mode(cluster: ReplicaCluster, via: int, mode: str) -> None:
    cluster.admin(via, "PUT", "/planner/mode", {"mode": mode}).raise_for_status()


def _mode_seen(cluster: ReplicaCluster, at: int, mode: str) -> bool:
    return bool(cluster.planner(at)["mode"] == mode)


def _pin_seen(cluster: ReplicaCluster, at: int, node: str, phase: str | None) -> bool:
    return bool(cluster.admin(at, "GET", "/pins").json()["nodes"].get(node) == phase)


def _revoke(cluster: ReplicaCluster, via: int, tenant: str, key_id: str) -> None:
    cluster.admin(via, "DELETE", f"/tenants/{tenant}/keys/{key_id}").raise_for_status()


def _revoked(cluster: ReplicaCluster, at: int, key: str) -> bool:
    return cluster.chat(at, key, max_tokens=1).status_code == 401


def _propagation(
    cluster: ReplicaCluster, write: Callable[[], None], seen: Callable[[], bool], timeout_s: float = 5.0
) -> float:
    t0 = time.monotonic()
    write()
    wait_until(seen, timeout_s, every_s=0.005, what="the change on another replica")
    return time.monotonic() - t0


def propagation_run(cluster: ReplicaCluster, rounds: int) -> dict[str, Any]:
    n = len(cluster.gateways)
    times: dict[str, list[float]] = {"revocation": [], "pin": [], "mode": []}
    node = cluster.admin(0, "GET", "/cluster").json()["nodes"][-1]["node_id"]  # a decode node: a pin needs no switch
    for r in range(rounds):
        src, dst = r % n, (r + 1) % n
        mode = "manual" if r % 2 == 0 else "advisory"
        times["mode"].append(
            _propagation(
                cluster,
                functools.partial(_put_mode, cluster, src, mode),
                functools.partial(_mode_seen, cluster, dst, mode),
            )
        )
        phase = "decode" if r % 2 == 0 else None

        def pin(src: int = src, phase: str | None = phase) -> None:
            path = f"/pins/nodes/{node}"
            (cluster.admin(src, "PUT", path, {"phase": phase}) if phase else cluster.admin(src, "DELETE", path))

        times["pin"].append(
            _propagation(
                cluster,
                pin,
                functools.partial(_pin_seen, cluster, dst, node, phase),
            )
        )
        tenant = f"rev{r}"
        key = cluster.tenant(tenant, via=src)
        assert cluster.chat(dst, key, max_tokens=1).status_code == 200
        key_id = cluster.admin(src, "GET", f"/tenants/{tenant}/keys").json()["items"][0]["id"]
        times["revocation"].append(
            _propagation(
                cluster,
                functools.partial(_revoke, cluster, src, tenant, key_id),
                functools.partial(_revoked, cluster, dst, key),
            )
        )
    cluster.admin(0, "PUT", "/planner/mode", {"mode": "advisory"})
    every = sorted(t for ts in times.values() for t in ts)
    p99 = every[min(len(every) - 1, int(round(0.99 * (len(every) - 1))))]
    return {
        "p99_s": round(p99, 4),
        "p50_s": round(statistics.median(every), 4),
        "max_s": round(every[-1], 4),
        "by_kind_p50_s": {k: round(statistics.median(v), 4) for k, v in times.items()},
        "samples": len(every),
    }


# -- failover and fencing -----------------------------------------------------------------
def failover_run(cluster: ReplicaCluster) -> dict[str, Any]:
    old = cluster.wait_leader()
    cluster.gateways[old].kill()
    killed = time.time()
    others = [i for i in range(len(cluster.gateways)) if i != old]
    new = cluster.wait_leader(among=others, timeout_s=15)

    def first_decision() -> float | None:
        d = cluster.planner(new)["last_decision"]
        return d["t"] if d and d["t"] > killed else None

    first = wait_until(first_decision, 15, every_s=0.02, what="the new leader's first decision")
    cluster.respawn(old)
    return {"failover_s": round(first - killed, 3), "old": f"g{old}", "new": f"g{new}"}


def fencing_run(cluster: ReplicaCluster) -> dict[str, Any]:
    old = cluster.wait_leader()
    term = cluster.planner(old)["leadership"]["term"]
    refused_before = sum(s["refused_orders"] for s in cluster.worker_stats())
    n_nodes = len(cluster.workers)
    threading.Thread(
        target=lambda: cluster.admin(old, "PUT", "/pins/split", {"prefill_nodes": n_nodes - 1}, timeout_s=120),
        daemon=True,
    ).start()
    wait_until(lambda: any(s["draining_to"] for s in cluster.worker_stats()), 15, what="the first switch")
    cluster.gateways[old].signal(signal.SIGSTOP)
    paused = time.time()
    try:
        others = [i for i in range(len(cluster.gateways)) if i != old]
        new = cluster.wait_leader(among=others, timeout_s=15)
        new_term = cluster.planner(new)["leadership"]["term"]
        wait_until(lambda: all(s["fence_term"] >= new_term for s in cluster.worker_stats()), 10, what="term seen")
        takeover = time.time()
    finally:
        cluster.gateways[old].signal(signal.SIGCONT)
    resumed = time.time()
    wait_until(
        lambda: sum(s["refused_orders"] for s in cluster.worker_stats()) > refused_before, 15, what="a refused order"
    )
    wait_until(lambda: not cluster.planner(old)["leadership"]["leading"], 10, what="the old leader stepped down")
    refused = sum(s["refused_orders"] for s in cluster.worker_stats()) - refused_before
    stale = [s for node in cluster.worker_switches() for s in node if s["term"] is not None and s["term"] < new_term]
    carried_out_after = [s for s in stale if s["t"] >= takeover]
    wait_until(lambda: cluster.admin(new, "GET", "/cluster").json()["split"][0] == n_nodes - 1, 20, what="pin met")
    cluster.admin(new, "DELETE", "/pins/split")
    return {
        "stale_orders_refused": refused,
        "stale_orders_carried_out": len(carried_out_after),
        "old_term": term,
        "new_term": new_term,
        "paused_s": round(resumed - paused, 2),
    }


# -- throughput -------------------------------------------------------------------------------
async def _load(urls: list[str], key: str, seconds: float, concurrency: int) -> float:
    done = 0
    stop = time.monotonic() + seconds
    body = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async def loop(i: int, h: httpx.AsyncClient) -> None:
        nonlocal done
        while time.monotonic() < stop:
            r = await h.post(urls[i % len(urls)] + "/v1/chat/completions", json=body)
            if r.status_code == 200:
                done += 1

    async with httpx.AsyncClient(timeout=30, limits=limits, headers={"Authorization": f"Bearer {key}"}) as h:
        t0 = time.monotonic()
        await asyncio.gather(*(loop(i, h) for i in range(concurrency)))
        return done / (time.monotonic() - t0)


def throughput(tmp: pathlib.Path, processes: int, args: argparse.Namespace) -> float:
    c = ReplicaCluster(tmp, replicas=1, processes=processes, phases=("decode", "decode"), token_delay_s=0.0)
    try:
        c.start()
        key = c.tenant("load")
        asyncio.run(_load([c.gateways[0].url], key, 2.0, args.concurrency))  # warm up every process
        return asyncio.run(_load([c.gateways[0].url], key, args.rps_s, args.concurrency))
    finally:
        c.close()


# -- main ---------------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> dict[str, Any]:
    if not pg_available() or not redis_available(REDIS):
        raise SystemExit("bench replicas needs PostgreSQL on 127.0.0.1:5432 and Redis on 127.0.0.1:6379")
    root = pathlib.Path(args.keep or tempfile.mkdtemp(prefix="bench-replicas-"))
    env = {"EVOLVING_PLANNER_MODE": "advisory", "EVOLVING_PLANNER_INTERVAL_S": "0.5"}
    phases = ("prefill", "decode", "decode", "decode")
    out: dict[str, Any] = {"workers": "fake (testing.fake_worker_app, worker protocol, no model)"}

    single = ReplicaCluster(root / "single", replicas=1, phases=phases, env=env)
    try:
        single.start()
        one, out["traffic_single"] = estimate_run(single, args)
    finally:
        single.close()

    cluster = ReplicaCluster(root / "cluster", replicas=args.replicas, phases=phases, env=env, switch_delay_s=1.0)
    try:
        cluster.start()
        with LeaderWatch(cluster) as watch:
            many, out["traffic_replicas"] = estimate_run(cluster, args)
            out["limits"] = limit_run(cluster, args.limit_s)
            out["propagation"] = propagation_run(cluster, args.rounds)
            out["failover"] = failover_run(cluster)
            time.sleep(1.0)
            out["fencing"] = fencing_run(cluster)
        out["leader_polls"] = watch.rounds
        out["leaders_per_term_max"] = max((len(v) for v in watch.per_term.values()), default=0)
    finally:
        cluster.close()

    def rel(key: str) -> float | None:
        """Relative difference; None when either gateway did not report `key` (never a made-up 0)."""
        if key not in many or key not in one or one[key] == 0:
            return None
        return round(abs(many[key] - one[key]) / abs(one[key]), 4)

    cpus = os.cpu_count() or 1
    rps1 = throughput(root / "rps1", 1, args)
    rpsn = throughput(root / "rpsn", cpus, args)
    result = {
        "leaders_max": watch.max_leading,
        "failover_s": out["failover"]["failover_s"],
        "stale_orders_refused": out["fencing"]["stale_orders_refused"],
        "stale_orders_carried_out": out["fencing"]["stale_orders_carried_out"],
        "limit_admitted_ratio": round(out["limits"]["ratio"], 4),
        "estimate_error": rel("offered_rate_rps"),
        "override_propagation_s": out["propagation"]["p99_s"],
        "rps_1_process": round(rps1, 1),
        "rps_n_processes": round(rpsn, 1),
        "n_processes": cpus,
        "estimate_parts": {
            k: {"single": one.get(k), "replicas": many.get(k), "error": rel(k)}
            for k in ("offered_rate_rps", "rate_rps", "uncached_mean", "cached_mean", "output_mean")
        },
        **out,
    }
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="evolving-infra bench replicas", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="print only the JSON object")
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--agents", type=int, default=12)
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--think-s", type=float, default=0.5, help="agent time between a response and its next turn")
    p.add_argument("--limit-s", type=float, default=30.0, help="the 200 requests of the limit check, spread over this")
    p.add_argument("--rounds", type=int, default=10, help="rounds of (mode, pin, revocation) changes")
    p.add_argument("--rps-s", type=float, default=8.0, help="seconds of load per throughput run")
    p.add_argument("--concurrency", type=int, default=48)
    p.add_argument("--keep", default=None, help="keep the logs in this folder")
    args = p.parse_args(argv)
    result = run(args)
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
