"""The engine faults of `bench chaos` (issue 31), one load window each.

The workers start with vLLM's stock CPU sampler (`--stock-cpu-sampler`),
under which a seeded prompt longer than the chunked-prefill budget kills
the engine: that makes the poison request and the engine death real vLLM
failures, not simulated ones. Every restart (an engine in place, or a
relaunched process) brings the fixed sampler, as a rollout of the fix
would, so the fuzz at the end runs against fixed workers.

Each fault runs under the agent load (a subset of the agents, the same
prompts as the reference run) with the phase switcher running, and reports
`sent, completed, failed, lost, duplicated_tokens` for the window's
requests, `detect_s` (the longest a dead engine stayed in routing: from its
engine-core process's death to the gateway's own out-of-routing timestamp,
`bench._chaos_watch`), `engines_died` and `back_in_service_s` (from the
first engine death to every node serving again; for the gateway restart,
from its stop to its serving again). A worker restarts a dead engine in
place (`workers.engine_heal`); the watchdog relaunches a process that
exited or gave up.

- `poison`: the issue's request (seeded long prompt + json_object) through
  the gateway: it kills an engine, then the one it is retried on, then is
  answered 500 request_quarantined (counted as failed, expected).
- `engine_death`: the same crash sent straight to one worker that still has
  the stock sampler: its engine dies inside the live process. The poison
  kills two engines at most, so with 3 workers one stock engine is left;
  the crash is re-sent until an engine dies (a switch may refuse it).
- `oom_kill`: SIGKILL of the busiest decode worker's engine-core process.
- `gateway_restart`: the gateway stops listening and drains its streams
  (60 s at most) while a fresh one starts on the same port; clients retry
  connections as the OpenAI SDK does by default. A stream the drain
  cannot finish ends `gateway_shutting_down` (counted failed, typed: it
  cannot continue on the new gateway), never as a dropped connection.
"""

from __future__ import annotations

import asyncio
import functools
import json
import pathlib
import random
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench._chaos_log import ChaosLog
from bench._chaos_switch import switcher
from bench._chaos_watch import DeathWatch
from cli.watchdog import RestartEvent, RestartPolicy, WorkerSpec, WorkerWatchdog
from testing.engine_faults import kill_engine

STOCK_FLAG = "--stock-cpu-sampler"
ENGINE_DEATH_TRIES_S = 90.0  # how long `engine_death` keeps trying to find and crash a stock engine


class WorkerProcesses:
    """`cli.watchdog.ProcessGroup` over the bench's `WorkerProcess`es. A
    restart drops the stock-sampler flag (the fix rolls in)."""

    def __init__(self, workers: dict[str, Any]) -> None:
        self.workers = workers
        self.keep_stock: set[str] = set()  # the next start of these keeps the stock sampler (once)

    def get(self, name: str) -> subprocess.Popen[bytes] | None:
        return self.workers[name].proc

    def stop(self, grace_s: float = 10.0, names: Sequence[str] | None = None) -> None:
        for n in names or list(self.workers):
            self.workers[n].stop(grace_s)

    def start(self, name: str, argv: list[str], log: pathlib.Path, env: dict[str, str] | None = None) -> None:
        w = self.workers[name]
        if "--phase" in argv:
            w.phase = argv[argv.index("--phase") + 1]
        if name in self.keep_stock:
            self.keep_stock.discard(name)
            w.extra = [*[x for x in w.extra if x != STOCK_FLAG], STOCK_FLAG]
        else:
            w.extra = [x for x in w.extra if x != STOCK_FLAG]
        w.start()

    def stock(self, name: str) -> bool:
        """Its engine still runs the stock sampler: the first process, never restarted in place."""
        w = self.workers[name]
        if STOCK_FLAG not in w.extra:
            return False
        try:
            return int(httpx.get(w.url + "/healthz", timeout=5).json().get("engine_restarts", 0)) == 0
        except (httpx.HTTPError, ValueError):
            return False


def watchdog(procs: WorkerProcesses, events: list[RestartEvent]) -> WorkerWatchdog:
    """The watchdog `up` runs, over `procs`: the same `WorkerProcesses` the
    windows use, so a relaunch `ensure_stock_engine` asks for keeps the
    stock sampler (with an instance of its own the watchdog never saw the
    request, and `engine_death` found no stock engine: skipped)."""
    specs = [
        WorkerSpec(n, w.url, ["--phase", w.phase], pathlib.Path(w.log_path), None, w.phase)
        for n, w in procs.workers.items()
    ]
    return WorkerWatchdog(procs, specs, policy=RestartPolicy(base_delay_s=0.5, max_restarts=4), on_event=events.append)


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
    registry: Callable[[], Any]  # the gateway's WorkerRegistry (in this process)
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
    await asyncio.sleep(1.0)  # the watchdog's next look reports the in-place restarts
    extra["engine_restarts_seen"] = sum(e.cause == "engine core died" for e in ctx.events[before:])
    return since(t0, detected), since(t0, back)


async def _stock_node(ctx: Ctx) -> dict[str, Any] | None:
    """A node in routing, not switching, whose engine still has the stock sampler."""
    for n in (await ctx.nodes()).values():
        if n["healthy"] and not n["draining_to"] and await asyncio.to_thread(ctx.procs.stock, n["node_id"]):
            return n
    return None


def crash_body(role: str) -> dict[str, Any]:
    """The engine-killing request (seeded, prompt over the chunked-prefill budget), straight to a worker."""
    rng = random.Random(7)
    return {
        "request_id": f"chaos-engine-death-{rng.randrange(10**9)}",
        "prompt_token_ids": [rng.randrange(5, 3000) for _ in range(2300)],
        "role": role,
        "sampling": {"max_tokens": 4, "temperature": 1.0, "seed": 7},
        "stream": False,
    }


async def engine_death(ctx: Ctx, extra: dict[str, Any]) -> tuple[float | None, float | None]:
    """Sent again until an engine dies: the switcher may move the chosen
    node out of its phase between the look and the call (a 409), and the
    one stock node left after the poison may be mid-switch at the first look."""
    t0 = time.monotonic()
    attempts: list[str] = []
    while time.monotonic() - t0 < ENGINE_DEATH_TRIES_S:
        node = await _stock_node(ctx)
        if node is None:
            if not any(await asyncio.gather(*(asyncio.to_thread(ctx.procs.stock, n) for n in ctx.workers))):
                break  # no engine with the stock sampler anywhere: nothing to kill this way
            await asyncio.sleep(0.5)
            continue
        sent = time.monotonic()
        async with httpx.AsyncClient(timeout=120) as c:
            r = await c.post(node["url"] + "/internal/generate", json=crash_body(node["phase"]))
        victim = node["node_id"]
        attempts.append(f"{victim}:{r.status_code}")
        detected = await wait_until(functools.partial(_node_out, ctx, victim), 10)
        if detected is None:
            continue  # refused (its phase changed) or it survived: another look
        extra.update(node=victim, worker_status=r.status_code, attempts=attempts)
        back = await wait_until(lambda: _all_in(ctx), 300)
        return since(sent, detected), since(sent, back)
    extra.update(skipped="no worker left with the stock sampler", attempts=attempts)
    return None, None


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
    watch = DeathWatch(ctx.workers, ctx.registry)
    watching = asyncio.create_task(watch.run())
    await asyncio.sleep(0.2)  # its first look: every engine core known alive
    t_fault = time.time()
    detect, back = await fault(ctx, extra)
    watch.stop()
    await watching
    extra["engines_died"] = len(watch.deaths)
    extra["detect_gaps_s"] = watch.gaps()
    if name == "poison":
        extra["engines_killed"] = len(watch.deaths)
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
        **{k: s[k] for k in ("missing_tokens", "mismatched_tokens", "tie_flips") if s[k]},
        **{k: s[k] for k in ("mismatch_detail", "lost_detail") if s[k]},
        **extra,
    }


async def ensure_stock_engine(ctx: Ctx) -> str | None:
    """Before `engine_death`: when no engine with the stock sampler is left
    (the poison may have killed all three under load), the last worker is
    stopped between windows, with no load running, and the watchdog
    relaunches it with the stock sampler. Returns the node relaunched."""
    if any(await asyncio.gather(*(asyncio.to_thread(ctx.procs.stock, n) for n in ctx.workers))):
        return None
    node = list(ctx.workers)[-1]
    ctx.procs.keep_stock.add(node)
    await asyncio.to_thread(ctx.workers[node].stop)
    await wait_until(functools.partial(_node_out, ctx, node), 15)
    await wait_until(lambda: _all_in(ctx), 300)
    return node


async def run_faults(ctx: Ctx) -> dict[str, Any]:
    out = {}
    for name, fault in FAULTS.items():
        if name not in ctx.cfg.faults:
            continue
        relaunched = await ensure_stock_engine(ctx) if name == "engine_death" else None
        out[name] = await window(ctx, name, fault)
        if relaunched is not None:
            out[name]["relaunched_with_stock_sampler"] = relaunched
        # Each window's record as it ends (stderr): a run cut short still shows its finished windows.
        print(f"chaos window {name}: {json.dumps(out[name], default=str)}", file=sys.stderr, flush=True)
    return out


async def engines_dead(ctx: Ctx) -> int:
    await wait_until(lambda: _all_in(ctx), 240)
    return sum(1 for n in (await ctx.nodes()).values() if n.get("engine") != "alive" or not n["healthy"])
