"""Per-iteration records from vLLM's own scheduler details.

vLLM (with `enable_logging_iteration_details`) attaches a
`SchedulerIterationDetails` to the scheduler stats of every engine step:
context (prefill) requests and tokens, generation requests and tokens, and
the step's elapsed time. A stat logger turns each into an
`IterationRecordWire` in a bounded ring the stats endpoint reads from.

Cached prompt tokens come from the same step's `IterationStats` (prompt
token breakdown of the prefills that completed in it); context tokens of the
decode batch come from the worker's own view of its in-flight requests.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from typing import Any

from core import Phase
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


class IterationLog(IndexedLog):
    """The engine's iteration records, and its latest scheduler view."""

    def __init__(self, capacity: int = 20_000) -> None:
        super().__init__(IterationRecordWire, capacity)
        # Latest scheduler view: (running, waiting, device KV usage 0..1).
        self.scheduler = (0, 0, 0.0)

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
