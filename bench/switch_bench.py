"""`evolving-infra bench switch --json`: in-place phase switch vs relaunch.

One worker on the demo model serves a light, steady stream of requests. In
the same run we time (a) in-place switches prefill->decode and back, several
times, and (b) relaunches: stop the worker process and start a new one in
the other phase until /readyz answers (what Dynamo does to change a split).
Requests are never given up on: a client that meets a wrong-phase error or a
dead worker retries until it completes, and `lost_requests` counts those
still unfinished at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import tempfile
import time

import httpx

from testing.worker_process import WorkerProcess


class LightLoad:
    """A request every `interval_s`, each retried until it completes."""

    def __init__(self, url: str, interval_s: float = 0.2, max_tokens: int = 8) -> None:
        self.url, self.interval_s, self.max_tokens = url, interval_s, max_tokens
        self.sent = self.completed = 0
        self.role = "prefill"
        self._tasks: set[asyncio.Task] = set()
        self._stop = asyncio.Event()
        self._ids = itertools.count()

    async def _one(self, client: httpx.AsyncClient, n: int) -> None:
        role = self.role
        body = {
            "request_id": f"sw-{n}",
            "prompt_token_ids": list(range(10, 74)),
            "role": role,
            "stream": False,
            "sampling": {"max_tokens": self.max_tokens, "ignore_eos": True},
        }
        deadline = time.monotonic() + 600
        attempt = 0
        while time.monotonic() < deadline:
            attempt += 1
            body["request_id"] = f"sw-{n}-{attempt}"
            try:
                r = await client.post(self.url + "/internal/generate", json=body, timeout=60)
                if r.status_code == 200 and r.json().get("finish_reason") in ("length", "stop"):
                    self.completed += 1
                    return
                if r.status_code == 409:  # wrong phase: the worker switched under us
                    body["role"] = "decode" if body["role"] == "prefill" else "prefill"
                    continue
            except httpx.HTTPError:
                pass  # worker relaunching: try again shortly
            await asyncio.sleep(0.2)

    async def run(self) -> None:
        async with httpx.AsyncClient() as client:
            while not self._stop.is_set():
                self.sent += 1
                t = asyncio.create_task(self._one(client, next(self._ids)))
                self._tasks.add(t)
                t.add_done_callback(self._tasks.discard)
                await asyncio.sleep(self.interval_s)
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def stop(self) -> None:
        self._stop.set()


def _summary(xs: list[float]) -> dict:
    return {"p50": statistics.median(xs), "max": max(xs), "n": len(xs), "all": [round(x, 4) for x in xs]}


def _start_ready(worker: WorkerProcess) -> float:
    return worker.start().wait_ready()


async def _inplace(url: str, load: LightLoad, to: str) -> float:
    async with httpx.AsyncClient() as client:
        start = time.monotonic()
        r = await client.post(url + "/internal/phase", json={"phase": to, "deadline_s": 5.0}, timeout=120)
        r.raise_for_status()
        load.role = to
        return time.monotonic() - start


async def run_bench(
    model: str, switches: int = 6, relaunches: int = 2, port: int = 8190, extra: list[str] | None = None
) -> dict:
    fd, log = tempfile.mkstemp(prefix="bench-switch-", suffix=".log")
    os.close(fd)  # the workers append to it by name
    worker = WorkerProcess(
        port=port, phase="prefill", model=model, node_id="bench-switch", log_path=log, extra=extra or []
    )
    await asyncio.to_thread(_start_ready, worker)
    load = LightLoad(worker.url)
    runner = asyncio.create_task(load.run())
    await asyncio.sleep(2.0)
    inplace, relaunch, phase = [], [], "prefill"
    for _ in range(switches):
        phase = "decode" if phase == "prefill" else "prefill"
        inplace.append(await _inplace(worker.url, load, phase))
        await asyncio.sleep(1.0)
    for _ in range(relaunches):
        phase = "decode" if phase == "prefill" else "prefill"
        start = time.monotonic()
        await asyncio.to_thread(worker.stop)
        worker = WorkerProcess(
            port=port, phase=phase, model=model, node_id="bench-switch", log_path=log, extra=extra or []
        )
        await asyncio.to_thread(_start_ready, worker)
        relaunch.append(time.monotonic() - start)
        load.role = phase
        await asyncio.sleep(1.0)
    load.stop()
    await asyncio.wait_for(runner, timeout=300)
    await asyncio.to_thread(worker.stop)
    ip, rl = _summary(inplace), _summary(relaunch)
    return {
        "inplace_switch_s": ip,
        "relaunch_s": rl,
        "speedup_p50": rl["p50"] / ip["p50"] if ip["p50"] > 0 else float("inf"),
        "requests_sent": load.sent,
        "requests_completed": load.completed,
        "lost_requests": load.sent - load.completed,
        "model": model,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="evolving-infra bench switch")
    p.add_argument("--model", default="data/demo-model")
    p.add_argument("--switches", type=int, default=6)
    p.add_argument("--relaunches", type=int, default=2)
    p.add_argument("--port", type=int, default=8190)
    p.add_argument("--no-kv-pool", action="store_true", help="run the worker without the KV pool connector")
    p.add_argument("--json", action="store_true", help="print one JSON object (the default output)")
    args = p.parse_args(argv)
    extra = ["--no-kv-pool"] if args.no_kv_pool else []
    result = asyncio.run(run_bench(args.model, args.switches, args.relaunches, args.port, extra))
    print(json.dumps(result))
    return 0 if result["lost_requests"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
