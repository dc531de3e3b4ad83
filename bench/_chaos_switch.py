"""The phase-switch fault of `bench chaos`: every `switch_every_s` seconds,
one healthy node switches phase through POST /admin/switch.

Candidates are the prefill nodes, and the decode nodes while more than one
decodes (the last decode node is never taken away); they are taken in turn.
A 409 (a switch already running, or refused) counts as refused, any other
non-ok answer as failed.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

import httpx

from bench._chaos_log import ChaosLog

if TYPE_CHECKING:
    from bench.chaos_bench import ChaosConfig


async def switcher(admin: httpx.AsyncClient, cfg: ChaosConfig, log: ChaosLog, stop: asyncio.Event) -> None:
    turn = 0
    while not stop.is_set():
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), cfg.switch_every_s)
        if stop.is_set():
            return
        try:
            nodes = [n for n in (await admin.get("/admin/cluster")).json()["nodes"] if n["healthy"]]
        except (httpx.HTTPError, KeyError, ValueError):
            log.switches_refused += 1
            continue
        decode = [n for n in nodes if n["phase"] == "decode"]
        candidates = [n for n in nodes if n["phase"] == "prefill" or len(decode) > 1]
        if not candidates:
            continue
        node = candidates[turn % len(candidates)]
        turn += 1
        to = "decode" if node["phase"] == "prefill" else "prefill"
        try:
            r = await admin.post(
                "/admin/switch", json={"node_id": node["node_id"], "to_phase": to, "reason": "chaos"}, timeout=180
            )
        except httpx.HTTPError as exc:
            log.switches_failed += 1
            log.events.append(f"switch {node['node_id']}: {exc!r}")
            continue
        outcome = r.json().get("outcome") if r.status_code == 200 else None
        if outcome == "ok":
            log.switches += 1
        elif r.status_code == 409:
            log.switches_refused += 1
        else:
            log.switches_failed += 1
            log.events.append(f"switch {node['node_id']} -> {to}: HTTP {r.status_code} {r.text[:200]}")
