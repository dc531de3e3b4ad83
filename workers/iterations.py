"""Per-iteration records from vLLM's own scheduler details.

vLLM (with `enable_logging_iteration_details`) attaches a
`SchedulerIterationDetails` to the scheduler stats of every engine step:
context (prefill) requests and tokens, generation requests and tokens, and
the step's elapsed time. A stat logger turns each into an
`IterationRecordWire` in a bounded ring the stats endpoint reads from.

Cached prompt tokens come from the same step's `IterationStats` (prompt
token breakdown of the prefills that completed in it); context tokens of the
decode batch come from the worker's own view of its in-flight requests.

Every record also carries the engine's **CPU share** since the record
before it (`CpuShareMeter`), what the planner's decode and prefill models
take as the feature "what shares the cores" (`planner.share`), and how
fast the host does a fixed piece of work (`workers.host_speed`). Linux keeps,
per thread, the nanoseconds it ran and the nanoseconds it sat runnable
waiting for a core (`/proc/<pid>/task/<tid>/schedstat`, fields 1 and 2);
``ran / (ran + waited)`` summed over the engine-core process's threads is
the share of the CPU it got while it wanted it: 1 when nothing competed for
its cores, 0.5 when another busy process took turns with it. It is read
when a record is appended (no sampling thread), at most every
`SHARE_READ_S`, and a record carries the share of the last span read:
reading every thread's file costs about 3.6 ms for a 52-thread process on
the loaded 2-core test host, so a read per decode step (tens of ms) would
itself take a tenth of a core from what it measures; a neighbour's load
lasts seconds, far longer than the span. An idle engine neither runs nor
waits, so a span with idle moments is not diluted. None where there is no
engine-core child process to read (not Linux, vLLM's engine in-process,
the engine restarting).
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core import Phase
from workers.host_speed import HostSpeedMeter
from workers.protocol import IterationRecordWire


class IndexedLog:
    """Bounded, thread-safe ring of wire records (`make(index=..., **fields)`)
    with a running index, read incrementally with `since`."""

    def __init__(self, make: Callable[..., Any], capacity: int = 20_000) -> None:
        self._make = make
        self._records: collections.deque = collections.deque(maxlen=capacity)
        self._lock = threading.Lock()
        self._next = 0

    def append(self, **fields) -> Any:
        with self._lock:
            rec = self._make(index=self._next, **fields)
            self._next += 1
            self._records.append(rec)
            return rec

    def since(self, index: int, limit: int = 5_000) -> list:
        with self._lock:
            out = [r for r in self._records if r.index >= index]
        return out[:limit]


ENGINE_COMM = "VLLM::EngineCor"  # vLLM's engine-core process name (15-character comm)


def engine_pids(parent: int, proc: Path = Path("/proc")) -> list[int]:
    """Pids of vLLM engine-core processes whose parent is ``parent``."""
    out = []
    try:
        entries = list(proc.iterdir())
    except OSError:
        return []
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # the process ended between listing and reading
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        if comm == ENGINE_COMM and int(fields[1]) == parent:
            out.append(int(entry.name))
    return out


def read_schedstat(pids: list[int], proc: Path = Path("/proc")) -> tuple[int, int, int]:
    """(ran_ns, waited_ns, threads read) summed over every thread of ``pids``."""
    ran = waited = threads = 0
    for pid in pids:
        try:
            tids = os.listdir(proc / str(pid) / "task")
        except OSError:
            continue
        for tid in tids:
            try:
                fields = (proc / str(pid) / "task" / tid / "schedstat").read_text().split()
            except OSError:
                continue  # the thread ended between listing and reading
            ran += int(fields[0])
            waited += int(fields[1])
            threads += 1
    return ran, waited, threads


def share_of(before: tuple[int, int], after: tuple[int, int]) -> float | None:
    """``ran / (ran + waited)`` between two cumulative readings; 1.0 when the
    engine neither ran nor waited; None when a counter went back (the
    threads read are not the same: one ended, or the engine was replaced)."""
    d_ran, d_wait = after[0] - before[0], after[1] - before[1]
    if d_ran < 0 or d_wait < 0:
        return None
    return 1.0 if d_ran + d_wait == 0 else d_ran / (d_ran + d_wait)


SHARE_READ_S = 0.2  # at most one read of the engine's counters per this many seconds (module doc)


class CpuShareMeter:
    """The engine core's CPU share over the last span read (module doc).
    ``clock``: monotonic seconds (injectable for tests)."""

    def __init__(
        self,
        parent: int | None = None,
        proc: Path = Path("/proc"),
        every_s: float = SHARE_READ_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.parent = os.getpid() if parent is None else parent
        self.proc = proc
        self.every_s = every_s
        self.clock = clock
        self._pids: list[int] = []
        self._last: tuple[int, int] | None = None
        self._read_at = -float("inf")
        self.share: float | None = None

    def read(self) -> float | None:
        now = self.clock()
        if now - self._read_at < self.every_s:
            return self.share
        self._read_at = now
        if not self._pids:
            self._pids = engine_pids(self.parent, self.proc)
        ran, waited, threads = read_schedstat(self._pids, self.proc) if self._pids else (0, 0, 0)
        if threads == 0:  # no engine (yet, or any more): find it again next time
            self._pids, self._last, self.share = [], None, None
            return None
        last, self._last = self._last, (ran, waited)
        self.share = None if last is None else share_of(last, (ran, waited))
        return self.share


class IterationLog(IndexedLog):
    """The engine's iteration records, and its latest scheduler view.
    ``share``: fills each record's ``cpu_share``; ``speed``: its
    ``host_probe_us`` (`workers.host_speed`); a field the caller passes is
    kept."""

    def __init__(
        self, capacity: int = 20_000, share: CpuShareMeter | None = None, speed: HostSpeedMeter | None = None
    ) -> None:
        super().__init__(IterationRecordWire, capacity)
        # Latest scheduler view: (running, waiting, device KV usage 0..1).
        self.scheduler = (0, 0, 0.0)
        self.share = CpuShareMeter() if share is None else share
        self.speed = HostSpeedMeter() if speed is None else speed

    def append(self, **fields) -> Any:
        if "cpu_share" not in fields:
            fields["cpu_share"] = self.share.read()
        if "host_probe_us" not in fields:
            fields["host_probe_us"] = self.speed.read()
        return super().append(**fields)

    def tokens_per_s(self, window_s: float = 10.0, now: float | None = None) -> float:
        now = time.time() if now is None else now
        with self._lock:
            recent = [r for r in self._records if r.t >= now - window_s]
        toks = sum(r.generated_tokens + r.uncached_prompt_tokens for r in recent)
        return toks / window_s


def make_stat_logger_factory(
    log: IterationLog, phase: Callable[[], Phase], context_tokens: Callable[[], int], records: bool = True
):
    """A vLLM per-engine stat logger factory that feeds `log`.

    With `records=False` it only keeps the scheduler view (running, waiting,
    KV usage): the KV connector then publishes the iteration records, timed
    around the forward pass itself.

    Imported lazily so this module stays importable without vLLM.
    """
    from vllm.v1.metrics.loggers import StatLoggerBase

    class _IterationStatLogger(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0) -> None:
            self.engine_index = engine_index

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0) -> None:
            if scheduler_stats is not None:
                log.scheduler = (
                    scheduler_stats.num_running_reqs,
                    scheduler_stats.num_waiting_reqs,
                    scheduler_stats.kv_cache_usage,
                )
            details = getattr(scheduler_stats, "iteration_details", None) if scheduler_stats else None
            if not records or details is None or details.is_dummy:
                return
            cached = iteration_stats.prompt_token_stats.cached_tokens if iteration_stats else 0
            log.append(
                t=time.time(),
                phase=phase(),
                batch_size=details.num_ctx_requests + details.num_generation_requests,
                uncached_prompt_tokens=details.num_ctx_tokens,
                cached_prompt_tokens=cached,
                generated_tokens=details.num_generation_tokens,
                context_tokens=context_tokens() if details.num_generation_requests else 0,
                elapsed_ms=details.elapsed_ms,
            )

        def log_engine_initialized(self) -> None:
            pass

    return _IterationStatLogger
