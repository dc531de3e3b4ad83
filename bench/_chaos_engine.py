"""The engine faults of `bench chaos` (issue 31), one load window each.

The workers start with vLLM's stock CPU sampler (`--stock-cpu-sampler`),
under which a seeded prompt longer than the chunked-prefill budget kills
the engine: that makes the poison request and the engine death real vLLM
failures, not simulated ones. A watchdog (`cli.watchdog`, what `up` runs)
restarts a worker whose engine died or whose process exited; every restart
brings the fixed sampler, as a rollout of the fix would, so the fuzz at the
end runs against fixed workers.

Each fault runs under the agent load (a subset of the agents, the same
prompts as the reference run) with the phase switcher running, and reports
`sent, completed, failed, lost, duplicated_tokens` for the window's
requests, `detect_s` (an upper bound on the longest a dead engine stayed in
routing: from its worker's last alive answer on /healthz before its first
`engine_dead`, polled in a loop with the gateway's view, to the gateway
taking the node out) and `back_in_service_s` (from the first
engine death to every node serving again; for the gateway restart, from
its stop to its serving again):

- `poison`: the issue's request (seeded long prompt + json_object) through
  the gateway: it kills an engine, then the one it is retried on, then is
  answered 500 request_quarantined (counted as failed, expected).
- `engine_death`: the same crash sent straight to one worker that still has
  the stock sampler: its engine dies inside the live process.
- `oom_kill`: SIGKILL of the busiest decode worker's engine-core process.
- `gateway_restart`: the gateway stops (draining its streams) and a fresh
  one starts on the same port; clients retry connections as the OpenAI SDK
  does by default.
"""

from __future__ import annotations

import asyncio
import pathlib
import random
import subprocess
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench._chaos_log import ChaosLog
from bench._chaos_switch import switcher
from cli.watchdog import RestartEvent, RestartPolicy, WorkerSpec, WorkerWatchdog
from testing.engine_faults import kill_engine

STOCK_FLAG = "--stock-cpu-sampler"


class WorkerProcesses:
    """`cli.watchdog.ProcessGroup` over the bench's `WorkerProcess`es. A
    restart drops the stock-sampler flag (the fix rolls in)."""

    def __init__(self, workers: dict[str, Any]) -> None:
        self.workers = workers

    def get(self, name: str) -> subprocess.Popen[bytes] | None:
        return self.workers[name].proc

    def stop(self, grace_s: float = 10.0, names: Sequence[str] | None = None) -> None:
        for n in names or list(self.workers):
            self.workers[n].stop(grace_s)

    def start(self, name: str, argv: list[str], log: pathlib.Path, env: dict[str, str] | None = None) -> None:
        w = self.workers[name]
        if "--phase" in argv:
            w.phase = argv[argv.index("--phase") + 1]
        w.extra = [x for x in w.extra if x != STOCK_FLAG]
        w.start()

    def stock(self, name: str) -> bool:
        return STOCK_FLAG in self.workers[name].extra


def watchdog(workers: dict[str, Any], events: list[RestartEvent]) -> WorkerWatchdog:
    specs = [
        WorkerSpec(n, w.url, ["--phase", w.phase], pathlib.Path(w.log_path), None, w.phase) for n, w in workers.items()
    ]
    return WorkerWatchdog(
        WorkerProcesses(workers), specs, policy=RestartPolicy(base_delay_s=0.5, max_restarts=4), on_event=events.append
    )


def poison_body(served_model: str, tokens: int = 2300) -> dict[str, Any]:
    rng = random.Random(31)
    words = " ".join(f"w{rng.randrange(100_000)}" for _ in range(tokens * 2 // 9))
    return {
        "model": served_model,
        "messages": [{"role": "user", "content": words}],
        "response_format": {"type": "json_object"},
        "temperature": 0.8,
        "max_tokens": 16,
    }


@dataclass
class Ctx:
    """What the fault windows share (built by `bench.chaos_bench.run`)."""

    cfg: Any
    gateway_url: Callable[[], str]
    admin_token: str
    client: Callable[[int], Any]  # max_retries -> an AsyncOpenAI client of tenant "chaos"
    run_agents: Callable[..., Coroutine[Any, Any, dict[tuple[str, int], Any]]]
    score: Callable[..., dict[str, Any]]
    tokenizer: Any
    plan: list[Any]
    reference: dict[tuple[str, int], Any]
    workers: dict[str, Any]
    procs: WorkerProcesses
    restart_gateway: Callable[[], Awaitable[None]]
    served_model: str
    api_key: str
    events: list[RestartEvent] = field(default_factory=list)

    def admin(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.gateway_url(), headers={"Authorization": f"Bearer {self.admin_token}"}, timeout=30
        )

    async def nodes(self) -> dict[str, dict[str, Any]]:
        try:
            async with self.admin() as a:
                return {n["node_id"]: n for n in (await a.get("/admin/cluster")).json()["nodes"]}
        except (httpx.HTTPError, KeyError, ValueError):
            return {}


async def wait_until(cond: Callable[[], Awaitable[bool]], timeout_s: float) -> float | None:
    """The monotonic time `cond()` first held (polled every 50 ms), None on timeout."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if await cond():
            return time.monotonic()
        await asyncio.sleep(0.05)
    return None


def since(t0: float, t: float | None) -> float | None:
    return None if t is None else t - t0


async def _node_out(ctx: Ctx, node: str) -> bool:
    return not (await ctx.nodes()).get(node, {}).get("healthy", True)


async def _any_out(ctx: Ctx) -> bool:
    return any(not n["healthy"] for n in (await ctx.nodes()).values())


async def _all_in(ctx: Ctx) -> bool:
    nodes = await ctx.nodes()
    return len(nodes) == len(ctx.workers) and all(n["healthy"] for n in nodes.values())


async def _post(ctx: Ctx, body: dict[str, Any]) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {ctx.api_key}"}
    async with httpx.AsyncClient(timeout=300) as c:
        r = await c.post(ctx.gateway_url() + "/v1/chat/completions", json=body, headers=headers)
    try:
        code = str(r.json()["error"]["code"]) if r.status_code >= 400 else ""
    except (ValueError, KeyError, TypeError):
        code = r.text[:100]
    return r.status_code, code


Fault = Callable[[Ctx, dict[str, Any]], Awaitable[tuple[float | None, float | None]]]


async def poison(ctx: Ctx, extra: dict[str, Any]) -> tuple[float | None, float | None]:
    before = len(ctx.events)
    t0 = time.monotonic()
    send = asyncio.create_task(_post(ctx, poison_body(ctx.served_model)))
    detected = await wait_until(lambda: _any_out(ctx), 60)
    extra["poison_status"], extra["poison_code"] = await send
    retry = await _post(ctx, poison_body(ctx.served_model))
    extra["poison_retry_status"], extra["poison_retry_code"] = retry
    back = await wait_until(lambda: _all_in(ctx), 300)
    extra["engines_killed"] = sum(e.cause == "engine core died" for e in ctx.events[before:])
    return since(t0, detected), since(t0, back)


async def engine_death(ctx: Ctx, extra: dict[str, Any]) -> tuple[float | None, float | None]:
    nodes = await ctx.nodes()
    stock = [n for n in nodes.values() if n["healthy"] and not n["draining_to"] and ctx.procs.stock(n["node_id"])]
    if not stock:
        extra["skipped"] = "no worker left with the stock sampler"
        return None, None
    node = stock[0]
    rng = random.Random(7)
    body = {
        "request_id": "chaos-engine-death",
        "prompt_token_ids": [rng.randrange(5, 3000) for _ in range(2300)],
        "role": node["phase"],
        "sampling": {"max_tokens": 4, "temperature": 1.0, "seed": 7},
        "stream": False,
    }
    t0 = time.monotonic()
    async with httpx.AsyncClient(timeout=120) as c:
        r = await c.post(node["url"] + "/internal/generate", json=body)
    extra.update(node=node["node_id"], worker_status=r.status_code)
    detected = await wait_until(lambda: _node_out(ctx, node["node_id"]), 30)
    back = await wait_until(lambda: _all_in(ctx), 300)
    return since(t0, detected), since(t0, back)


async def oom_kill(ctx: Ctx, extra: dict[str, Any]) -> tuple[float | None, float | None]:
    nodes = [n for n in (await ctx.nodes()).values() if n["healthy"]]
    victim = sorted(nodes, key=lambda n: (n["phase"] != "decode", -n["running"]))[0]["node_id"]
    t0 = time.monotonic()
    kill_engine(ctx.workers[victim].proc.pid)
    extra["node"] = victim
    detected = await wait_until(lambda: _node_out(ctx, victim), 30)
    back = await wait_until(lambda: _all_in(ctx), 300)
    return since(t0, detected), since(t0, back)


async def gateway_restart(ctx: Ctx, extra: dict[str, Any]) -> tuple[float | None, float | None]:
    """detect_s here: how long no gateway answered (the drain and the new start)."""
    t0 = time.monotonic()
    await ctx.restart_gateway()
    up = await wait_until(lambda: _answers(ctx), 60)
    back = await wait_until(lambda: _all_in(ctx), 120)
    return since(t0, up), since(t0, back)


async def _answers(ctx: Ctx) -> bool:
    try:
        async with httpx.AsyncClient(timeout=2) as c:
            return (await c.get(ctx.gateway_url() + "/healthz")).status_code == 200
    except httpx.HTTPError:
        return False


FAULTS: dict[str, Fault] = {
    "poison": poison,
    "engine_death": engine_death,
    "oom_kill": oom_kill,
    "gateway_restart": gateway_restart,
}


class DeathWatch:
    """Polls every worker's /healthz and the gateway's cluster view in a loop
    (every 50 ms plus the calls): when each worker last answered alive
    before it first said its engine was dead (or stopped answering), and
    when the gateway first took it out of routing. `detect_s` of a window is
    the longest gap between the two over the workers that died: an upper
    bound on how long a dead engine stayed in routing (the death came after
    the last alive answer; the loop's own period is included)."""

    def __init__(self, ctx: Ctx) -> None:
        self.ctx = ctx
        self.dead_at: dict[str, float] = {}  # the last alive answer before the first dead one
        self.alive_at: dict[str, float] = {}
        self.out_at: dict[str, float] = {}
        self._stop = asyncio.Event()

    async def run(self) -> None:
        async with httpx.AsyncClient(timeout=1.0) as c:
            while not self._stop.is_set():
                for name, w in self.ctx.workers.items():
                    if name in self.dead_at:
                        continue
                    asked = time.monotonic()
                    try:
                        down = (await c.get(w.url + "/healthz")).status_code == 503
                    except httpx.HTTPError:
                        down = True
                    if down:
                        self.dead_at[name] = self.alive_at.get(name, asked)
                    else:
                        self.alive_at[name] = asked
                for node_id, n in (await self.ctx.nodes()).items():
                    if not n["healthy"] and node_id not in self.out_at:
                        self.out_at[node_id] = time.monotonic()
                await asyncio.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()

    def detect_s(self) -> float | None:
        gaps = [max(0.0, self.out_at[n] - t) for n, t in self.dead_at.items() if n in self.out_at]
        return max(gaps) if gaps else None

    def first_death(self) -> float | None:
        return min(self.dead_at.values()) if self.dead_at else None


async def window(ctx: Ctx, name: str, fault: Fault) -> dict[str, Any]:
    """One fault under the agent load with switches; the window's record."""
    log, stop = ChaosLog(), asyncio.Event()
    extra: dict[str, Any] = {}
    admin = ctx.admin()
    sw = asyncio.create_task(switcher(admin, ctx.cfg, log, stop))
    # The SDK's own connection retries (what a harness has) only in the gateway window.
    retries = 4 if name == "gateway_restart" else 0
    load = asyncio.create_task(ctx.run_agents(ctx.client(retries), ctx.cfg, ctx.plan, ctx.reference))
    await asyncio.sleep(ctx.cfg.fault_at_s)
    watch = DeathWatch(ctx)
    watching = asyncio.create_task(watch.run())
    t_fault = time.monotonic()
    detect, back = await fault(ctx, extra)
    watch.stop()
    await watching
    if name != "gateway_restart":  # measured from the engine's death, not from the fault's start
        died = watch.first_death()
        detect = watch.detect_s()
        if died is not None and back is not None:
            back -= died - t_fault
    results = await load
    stop.set()
    await sw
    await admin.aclose()
    s = ctx.score(ctx.tokenizer, ctx.reference, results)
    if name == "poison":  # the poison itself: one more request, failed as it must
        s["sent"] += 2
        s["failed"] += 2 if extra.get("poison_retry_status") == 500 else 1
    return {
        "sent": s["sent"],
        "completed": s["completed"],
        "failed": s["failed"],
        "lost": s["lost"],
        "duplicated_tokens": s["duplicated_tokens"],
        "detect_s": None if detect is None else round(detect, 2),
        "back_in_service_s": None if back is None else round(back, 1),
        "errors": s["errors"],
        "switches": log.switches,
        **extra,
    }


async def run_faults(ctx: Ctx) -> dict[str, Any]:
    out = {}
    for name, fault in FAULTS.items():
        out[name] = await window(ctx, name, fault)
    return out


async def engines_dead(ctx: Ctx) -> int:
    await wait_until(lambda: _all_in(ctx), 240)
    return sum(1 for n in (await ctx.nodes()).values() if n.get("engine") != "alive" or not n["healthy"])
