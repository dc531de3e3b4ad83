"""The gateway's per-request stages timed in place (`bench gateway --stages`).

Profilers mislead on this path. Under cProfile the chat template took 207
of 1,290 µs a request (its per-call hook weighs on call-heavy code), a
tight loop of the same call measures 37 µs, and in the serving process
under wrk it takes 78-92 µs of ~540: code run once a request between a
thousand other calls runs 2-3x slower than the same code in a loop. Only
timing it where it runs says what it costs there.

`StageClock` wraps named synchronous functions with two `perf_counter`
reads (~0.3 µs a call) and keeps, per stage, calls, seconds and self
seconds (less the stages called inside it: the worker read's callback
writes a relayed token, say). In the gateway process `install` does it
before the app is built (module-level names bound by `from ... import`
elsewhere are rebound too) and answers SIGUSR1 (reset) and SIGUSR2 (write
the totals as JSON). The case runs its own gateway process, so the
wrappers never touch the headline figures.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import os
import pathlib
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

# What one streamed chat request runs, in order (module:qualified name).
STAGES: tuple[str, ...] = (
    "gateway.serving.openai.routes:parse_model",
    "gateway.serving.openai.convert:chat_spec",
    "gateway.serving.turn.branch:branch_from_headers",
    "gateway.serving.chat_render:ChatRenderer.conversation",
    "gateway.serving.chat_render:ChatRenderer.render",
    "gateway.serving.token_pieces:PieceEncoder.encode",
    "gateway.kv.directory:GatewayDirectory.block_hashes",
    "gateway.serving.turn.prepare:sampling_options",
    "routing.picker:route",
    "gateway.serving.detokenize:ByteDetokenizer.push",
    "gateway.serving.turn.accounting:Accounting.job_finished",
    "gateway.upstream.wire:encode_generate",
    "gateway.upstream.raw_client:_Connection.send",
    "gateway.upstream.raw_client:_Connection.data_received",
    "gateway.upstream.wire:decode_chunks",
    "gateway.http.coalesce:CoalescingTransport.flush",
)

RESET, DUMP = signal.SIGUSR1, signal.SIGUSR2
ENV = "EVOLVING_BENCH_STAGES"  # the gateway process installs the clock when set (the totals' file)
NAME = "gateway-stages"


def resolve(spec: str) -> tuple[Any, str, Any]:
    """`module:qualified.name` -> (the object holding it, its attribute name, the value as stored there)."""
    module_name, _, qualname = spec.partition(":")
    owner: Any = importlib.import_module(module_name)
    *path, attr = qualname.split(".")
    for part in path:
        owner = getattr(owner, part)
    return owner, attr, inspect.getattr_static(owner, attr)


class StageClock:
    """Calls, seconds and self seconds of each wrapped function, by its
    `module:name` spec. A stage called inside another (render calls
    conversation) counts in both; its time is not in the outer one's self
    seconds. Per thread (a big prompt is rendered in a worker thread)."""

    def __init__(self) -> None:
        self._totals: dict[str, list[float]] = {}
        self._local = threading.local()  # .stack: the running stages' children's seconds

    def wrap(self, spec: str) -> None:
        owner, attr, original = resolve(spec)
        if not inspect.isfunction(original):
            raise ValueError(f"{spec}: not a plain function or method")
        if inspect.iscoroutinefunction(original) or inspect.isasyncgenfunction(original):
            raise ValueError(f"{spec}: asynchronous (its time would include the waits)")
        totals = self._totals.setdefault(spec, [0, 0.0, 0.0])
        clock, local = time.perf_counter, self._local

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            stack = local.__dict__.setdefault("stack", [])
            stack.append(0.0)
            t0 = clock()
            try:
                return original(*args, **kwargs)
            finally:
                elapsed = clock() - t0
                inner = stack.pop()
                totals[0] += 1
                totals[1] += elapsed
                totals[2] += elapsed - inner
                if stack:
                    stack[-1] += elapsed

        setattr(owner, attr, timed)
        if inspect.ismodule(owner):  # a module-level function: other modules' `from ... import` names too
            for module in list(sys.modules.values()):
                namespace = getattr(module, "__dict__", None)
                for name, value in list((namespace or {}).items()):
                    if value is original:
                        setattr(module, name, timed)

    def reset(self) -> None:
        for totals in self._totals.values():
            totals[:] = [0, 0.0, 0.0]

    def snapshot(self) -> dict[str, dict[str, float]]:
        return {spec: {"calls": t[0], "seconds": t[1], "self_seconds": t[2]} for spec, t in self._totals.items()}


def install(out: str, stages: Iterable[str] = STAGES) -> StageClock:
    """Wrap `stages` in this process; SIGUSR1 resets, SIGUSR2 writes the totals to `out`."""
    clock = StageClock()
    for spec in stages:
        clock.wrap(spec)
    path = pathlib.Path(out)

    def dump(*_: object) -> None:
        part = path.with_name(path.name + ".part")
        part.write_text(json.dumps(clock.snapshot()))
        part.replace(path)  # the reader never sees half a file

    signal.signal(RESET, lambda *_: clock.reset())
    signal.signal(DUMP, dump)
    return clock


def per_request(snapshot: dict[str, dict[str, float]], requests: int, cpu_us: float | None) -> dict[str, Any]:
    """µs (with and without the stages inside) and calls a request per stage,
    and the share of the process's CPU a request (`cpu_us`) they account for."""
    n = max(requests, 1)
    stages = {
        spec.partition(":")[2]: {
            "us_per_request": round(1e6 * t["seconds"] / n, 1),
            "self_us_per_request": round(1e6 * t["self_seconds"] / n, 1),
            "calls_per_request": round(t["calls"] / n, 2),
        }
        for spec, t in snapshot.items()
    }
    timed = 1e6 * sum(t["self_seconds"] for t in snapshot.values()) / n
    share = round(timed / cpu_us, 3) if cpu_us else None
    return {"requests": requests, "cpu_us_per_request": cpu_us, "stages": stages, "timed_share": share}


def run_case(load: Callable[[], dict[str, Any]], pid: int, out: pathlib.Path) -> dict[str, Any]:
    """One load run (`load()` -> a wrk row) against the gateway `pid` started
    with the clock installed, after a warm-up run; its totals per request."""
    load()  # warm: connections, caches, the interpreter's specializations
    os.kill(pid, RESET)
    row = load()
    os.kill(pid, DUMP)
    deadline = time.monotonic() + 10
    while not out.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    snapshot = json.loads(out.read_text())
    return per_request(snapshot, int(row["requests"]), row.get("cpu_us_per_request", {}).get("proxy"))
