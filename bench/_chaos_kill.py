"""The crash fault of `bench chaos`: after `kill_after_s`, the busiest
healthy decode worker (any node when none decodes) is SIGKILLed; after
`restart_after_s` more it is started again and waited for.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import httpx

from bench._chaos_log import ChaosLog

if TYPE_CHECKING:
    from bench.chaos_bench import ChaosConfig


async def killer(admin: httpx.AsyncClient, workers: dict[str, Any], cfg: ChaosConfig, log: ChaosLog) -> None:
    await asyncio.sleep(cfg.kill_after_s)
    nodes = (await admin.get("/admin/cluster")).json()["nodes"]
    decode = sorted((n for n in nodes if n["healthy"] and n["phase"] == "decode"), key=lambda n: -n["running"])
    victim = (decode or nodes)[0]["node_id"]
    workers[victim].kill()
    log.worker_kills += 1
    log.killed_node = victim
    log.events.append(f"killed {victim} at {cfg.kill_after_s:.0f}s")
    await asyncio.sleep(cfg.restart_after_s)
    t0 = time.monotonic()
    await asyncio.to_thread(lambda: workers[victim].start().wait_ready(600))
    log.restart_s = time.monotonic() - t0
    log.worker_restarts += 1
    log.events.append(f"restarted {victim} in {log.restart_s:.0f}s")
