"""`PriorityAdmission`: a global concurrency limit with priority-ordered waiting.

When all `limit` slots are taken, callers wait; a freed slot goes to the
waiter with the best (lowest) priority class, first come first served within
a class. A caller that waits longer than `max_wait_s` gets `RateLimited`
(429) instead of queueing forever. `limit=None` admits everything at once.
Event-loop only (not thread-safe).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools

from gateway.http import errors


class PriorityAdmission:
    def __init__(self, *, limit: int | None, max_wait_s: float) -> None:
        if limit is not None and limit < 1:
            raise ValueError("limit must be >= 1 or None")
        if max_wait_s < 0:
            raise ValueError("max_wait_s must be >= 0")
        self.limit = limit
        self.max_wait_s = max_wait_s
        self.in_use = 0
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    @property
    def waiting(self) -> int:
        return sum(1 for _, _, f in self._waiters if not f.done())

    async def acquire(self, priority: int) -> None:
        """Take a slot, waiting in priority order up to `max_wait_s`."""
        if self.limit is None or (self.in_use < self.limit and not self.waiting):
            self.in_use += 1
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (priority, next(self._seq), future))
        try:
            await asyncio.wait_for(asyncio.shield(future), timeout=self.max_wait_s)
        except TimeoutError:
            if future.done() and not future.cancelled():
                return  # the slot was handed over just as the wait ended
            future.cancel()
            raise errors.RateLimited(
                "The cluster is at capacity; try again shortly.",
                retry_after_s=max(1.0, self.max_wait_s),
                code="cluster_saturated",
            ) from None
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release()  # handed a slot we will not use
            else:
                future.cancel()
            raise

    def release(self) -> None:
        """Free a slot: hand it to the best waiter, or return it to the pool."""
        while self._waiters:
            _, _, future = heapq.heappop(self._waiters)
            if not future.done():
                future.set_result(None)  # the slot moves to the waiter; in_use unchanged
                return
        self.in_use -= 1
