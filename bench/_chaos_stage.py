"""Step 4 of `bench chaos`: the engine faults, the fuzz, the engines dead at the end."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import TYPE_CHECKING, Any

from bench._chaos_cluster import GatewayThread
from bench._chaos_load import AgentClients, Outcome, agents, run_agents, score

if TYPE_CHECKING:
    from bench.chaos_bench import ChaosConfig


def engine_stage(
    cfg: ChaosConfig,
    holder: dict[str, GatewayThread],
    fresh_gateway: Any,
    keys: dict[str, str],
    workers: dict[str, Any],
    tokenizer: Any,
    reference: dict[tuple[str, int], Outcome],
    settings: Any,
) -> dict[str, Any]:
    """Step 4: the engine faults, the fuzz, the engines dead at the end."""
    from bench import _chaos_engine as ce
    from bench._chaos_fuzz import fuzz

    clients = AgentClients(lambda: holder["gw"].url, settings.served_model, cfg.request_timeout_s)

    def client(retries: int) -> Any:
        return clients(keys["chaos"], retries)

    async def run_faults() -> dict[str, Any]:
        try:
            return await ce.run_faults(ctx)
        finally:
            await clients.aclose()

    async def restart_gateway() -> None:
        """A rolling restart on one port: the old gateway stops listening and
        drains its streams (60 s at most) while the new one starts serving."""
        old = holder["gw"]
        old.graceful_s = 60.0
        old.begin_stop()
        for _ in range(200):  # it closes its listener within a tick of its loop
            if not old.listening():
                break
            await asyncio.sleep(0.05)
        new = fresh_gateway()
        await asyncio.to_thread(new.start)
        holder["gw"] = new  # the old one's thread ends when its drain does

    events: list[Any] = []
    ctx = ce.Ctx(
        cfg=cfg,
        gateway_url=lambda: holder["gw"].url,
        admin_token=keys["admin"],
        client=client,
        run_agents=run_agents,
        score=score,
        tokenizer=tokenizer,
        plan=agents(cfg)[: cfg.fault_agents],
        reference=reference,
        workers=workers,
        procs=ce.WorkerProcesses(workers),
        restart_gateway=restart_gateway,
        registry=lambda: holder["gw"].app.state.runtime.registry,
        served_model=settings.served_model,
        api_key=keys["chaos"],
        events=events,
    )
    dog = ce.watchdog(ctx.procs, events)
    dog.start()
    try:
        faults = asyncio.run(run_faults())
        dead_before_fuzz = asyncio.run(ce.engines_dead(ctx))
        fuzzed = fuzz(holder["gw"].url, keys["chaos"], settings.served_model, cfg.fuzz_cases)
        dead_after = asyncio.run(ce.engines_dead(ctx))
    finally:
        dog.stop()
    return {
        "faults": faults,
        **fuzzed,
        "engines_dead_before_fuzz": dead_before_fuzz,
        "engines_dead_after": dead_after,
        "worker_restarts_by_watchdog": [dataclasses.asdict(e) for e in events],
    }
