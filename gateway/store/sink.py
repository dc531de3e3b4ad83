"""`EventSink`: buffered, non-blocking writes of decisions, switch events,
usage, audit entries and overrides.

Contract: the `record_*` methods only append to memory under a short lock;
they never block on I/O and never raise (callable from the event loop or
from threads). A background task (`start()`/`stop()`) writes the buffer every
`flush_interval_s` in one transaction in a worker thread. When the database
is unreachable the batch is put back and retried with exponential backoff,
so nothing is lost while the process lives. Usage is summed per
(tenant, minute, model) in memory, so an outage of any length costs one row
per tenant-minute, not one per request. The event buffer is bounded
(`max_buffered`); past it the oldest entry is dropped and counted.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import exc as sa_exc
from sqlalchemy.orm import Session

from gateway.store import repository
from gateway.store.db import Database, StoreUnavailable
from gateway.store.records import SwitchOutcome, UsageRecord
from planner.types import Decision

log = logging.getLogger(__name__)
UsageKey = tuple[str, int, str]  # tenant_id, minute, model
# Errors that condemn a row, not the link: logged, counted, dropped.
_ROW_ERRORS = (sa_exc.SQLAlchemyError, TypeError, ValueError, AttributeError)


@dataclass(frozen=True)
class SinkConfig:
    flush_interval_s: float = 1.0  # time between two writes when healthy
    max_buffered: int = 200_000  # events held in memory; oldest dropped past it
    max_batch: int = 2_000  # events per transaction
    retry_initial_s: float = 0.5  # first backoff after a failed write
    retry_max_s: float = 30.0  # backoff ceiling
    stop_timeout_s: float = 5.0  # final flush budget on stop()

    def __post_init__(self) -> None:
        if self.flush_interval_s <= 0 or self.retry_initial_s <= 0 or self.retry_max_s < self.retry_initial_s:
            raise ValueError("flush/retry intervals must be > 0 and retry_max_s >= retry_initial_s")
        if self.max_buffered < 1 or self.max_batch < 1:
            raise ValueError("max_buffered and max_batch must be >= 1")


@dataclass
class SinkStats:
    pending_events: int = 0
    pending_usage_rows: int = 0
    written: int = 0  # events + usage rows committed
    dropped: int = 0  # buffer overflow
    rejected: int = 0  # rows the database refused (not connectivity); logged
    failed_flushes: int = 0
    last_error: str = ""


Entry = Callable[[Session], Any]  # writes one event into a session


class EventSink:
    """Buffered writer of store events; see the module docstring for the contract."""

    def __init__(
        self, db: Database, *, config: SinkConfig | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self.db = db
        self.config = config or SinkConfig()
        self._clock = clock
        self._lock = threading.Lock()
        self._events: collections.deque[Entry] = collections.deque()
        self._usage: dict[UsageKey, list[int]] = {}
        self._stats = SinkStats()
        self._flush_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    # -- recording (never blocks, never raises) -------------------------------

    def _append(self, entry: Entry) -> None:
        with self._lock:
            if len(self._events) >= self.config.max_buffered:
                self._events.popleft()
                self._stats.dropped += 1
                if self._stats.dropped in (1, 10, 100) or self._stats.dropped % 10_000 == 0:
                    log.error("event sink buffer full: %d events dropped", self._stats.dropped)
            self._events.append(entry)

    def record_decision(self, decision: Decision, mode: str) -> None:
        self._append(lambda s: repository.add_decision(s, decision=decision, mode=mode))

    def record_switch(self, outcome: SwitchOutcome, reason: str, who: str, t: float | None = None) -> None:
        at = self._clock() if t is None else t
        self._append(lambda s: repository.add_switch_event(s, t=at, outcome=outcome, reason=reason, who=who))

    def record_audit(
        self,
        *,
        actor: str,
        action: str,
        target: str,
        before: Any = None,
        after: Any = None,
        t: float | None = None,
        actor_id: str | None = None,
    ) -> None:
        at = self._clock() if t is None else t
        before, after = repository.json_safe(before), repository.json_safe(after)  # snapshot now
        self._append(
            lambda s: repository.add_audit(
                s, actor=actor, actor_id=actor_id, action=action, target=target, before=before, after=after, t=at
            )
        )

    def record_override(self, *, key: str, value: Any, who: str, t: float | None = None) -> None:
        at = self._clock() if t is None else t
        value = repository.json_safe(value)
        self._append(lambda s: repository.set_override(s, key=key, value=value, who=who, t=at))

    def record_usage(self, usage: UsageRecord, t: float | None = None) -> None:
        key = (usage.tenant_id, repository.minute_of(self._clock() if t is None else t), usage.model)
        with self._lock:
            row = self._usage.setdefault(key, [0, 0, 0, 0])
            row[0] += 1
            row[1] += usage.prompt_tokens
            row[2] += usage.cached_tokens
            row[3] += usage.completion_tokens

    @property
    def stats(self) -> SinkStats:
        with self._lock:
            self._stats.pending_events = len(self._events)
            self._stats.pending_usage_rows = len(self._usage)
            return SinkStats(**vars(self._stats))

    # -- writing -------------------------------------------------------------

    def _take(self) -> tuple[list[Entry], dict[UsageKey, list[int]]]:
        with self._lock:
            n = min(len(self._events), self.config.max_batch)
            batch = [self._events.popleft() for _ in range(n)]
            usage, self._usage = self._usage, {}
            return batch, usage

    def _put_back(self, batch: list[Entry], usage: dict[UsageKey, list[int]]) -> None:
        with self._lock:
            self._events.extendleft(reversed(batch))  # keep order; may exceed the bound briefly
            for key, counts in usage.items():
                row = self._usage.setdefault(key, [0, 0, 0, 0])
                for i, value in enumerate(counts):
                    row[i] += value

    @staticmethod
    def _write_usage(session: Session, key: UsageKey, counts: list[int]) -> None:
        repository.add_usage(
            session,
            tenant_id=key[0],
            minute=key[1],
            model=key[2],
            requests=counts[0],
            prompt_tokens=counts[1],
            cached_tokens=counts[2],
            completion_tokens=counts[3],
        )

    def _write(self, batch: list[Entry], usage: dict[UsageKey, list[int]]) -> int:
        """Write everything in one transaction; on a non-connectivity error fall
        back to one transaction per row so one bad row cannot block the rest.

        Written (or rejected) items are removed from `batch`/`usage`, so after
        a `StoreUnavailable` whatever is left is exactly what must be retried.
        """
        size = len(batch) + len(usage)
        try:
            with self.db.session() as session:
                for entry in batch:
                    entry(session)
                for key, counts in usage.items():
                    self._write_usage(session, key, counts)
            batch.clear()
            usage.clear()
            return size
        except StoreUnavailable:
            raise
        except _ROW_ERRORS as exc:
            log.warning("event batch rejected (%s); writing rows one by one", exc)
        written = 0
        for entry in list(batch):
            written += self._write_one(entry)
            batch.remove(entry)
        for key, counts in list(usage.items()):
            written += self._write_one(functools.partial(self._write_usage, key=key, counts=counts))
            del usage[key]
        return written

    def _write_one(self, write: Entry) -> int:
        try:
            with self.db.session() as session:
                write(session)
            return 1
        except StoreUnavailable:
            raise
        except _ROW_ERRORS as exc:
            log.error("event row rejected by the database, dropped: %s", exc)
            with self._lock:
                self._stats.rejected += 1
            return 0

    def _settle(self, job: asyncio.Future[int], batch: list[Entry], usage: dict[UsageKey, list[int]]) -> bool:
        exc = job.exception()
        if exc is None:
            with self._lock:
                self._stats.written += job.result()
            return True
        self._put_back(batch, usage)
        with self._lock:
            self._stats.failed_flushes += 1
            self._stats.last_error = str(exc.__cause__ or exc)
        if not isinstance(exc, StoreUnavailable):
            log.error("event sink write failed unexpectedly: %r", exc)
        return False

    async def flush(self) -> bool:
        """Write one batch now. False if the write failed (the data is kept)."""
        async with self._flush_lock:
            batch, usage = self._take()
            if not batch and not usage:
                return True
            job = asyncio.ensure_future(asyncio.to_thread(self._write, batch, usage))
            try:
                # wait() never raises the job's own error: _settle reads it,
                # counts it and puts the rows back.
                await asyncio.wait([job])
            except asyncio.CancelledError:
                # Let the thread finish so its rows are neither lost nor written twice.
                await asyncio.wait([job])
                self._settle(job, batch, usage)
                raise
            return self._settle(job, batch, usage)

    async def flush_all(self) -> bool:
        """Flush until the buffer is empty or a write fails (tests, shutdown:
        under steady traffic this may not return; the writer uses
        `flush_backlog`)."""
        while True:
            if not await self.flush():
                return False
            with self._lock:
                if not self._events and not self._usage:
                    return True

    async def flush_backlog(self) -> bool:
        """Write what was buffered when called (in batches of `max_batch`),
        not what arrives meanwhile: under steady traffic the buffer is never
        empty, and waiting for that wrote one transaction per request."""
        with self._lock:
            batches = max(1, -(-len(self._events) // self.config.max_batch))
        for _ in range(batches):
            if not await self.flush():
                return False
        return True

    async def _run(self) -> None:
        delay = self.config.flush_interval_s
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=delay)
            self._wake.clear()
            if await self.flush_backlog():
                delay = self.config.flush_interval_s
            else:
                delay = min(self.config.retry_max_s, max(delay * 2, self.config.retry_initial_s))
                log.warning("store unreachable; %d events buffered, retry in %.1fs", self.stats.pending_events, delay)

    def start(self) -> None:
        """Start the background writer on the running event loop (idempotent)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="event-sink")

    def kick(self) -> None:
        """Ask the writer to flush now instead of at the next interval."""
        self._wake.set()

    async def stop(self) -> None:
        """Stop the writer and try a final flush within `stop_timeout_s`."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        deadline = time.monotonic() + self.config.stop_timeout_s
        while time.monotonic() < deadline and await self.flush():
            with self._lock:
                if not self._events and not self._usage:
                    break
        left = self.stats
        if left.pending_events or left.pending_usage_rows:
            log.error(
                "event sink stopped with %d events and %d usage rows unwritten",
                left.pending_events,
                left.pending_usage_rows,
            )
