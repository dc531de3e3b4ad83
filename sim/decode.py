"""Decode side of a simulated node: continuous batching, run in segments.

Between two batch changes (an admission or a completion) the batch is fixed,
so k decode iterations take, in ms,

    T(k) = extra + k * f0 + g * k * (k - 1) / 2,

with f0 = decode_ms(B, C0) and g = B * (d decode_ms / d context) because the
context grows by B tokens per iteration; `extra` is the local-prefill work of
requests admitted at the segment start (vLLM's mixed batch). One event per
segment instead of one per iteration keeps a 3,072-GPU hour tractable. An
arrival during a segment cuts it at the iteration then in progress, so
admission happens exactly at the next iteration boundary, as in vLLM.

Admission reserves prompt + output tokens of device KV (no preemption).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable

from core import Phase
from sim.events import EventLoop
from sim.state import IterationModel, NodeConfig, RawRecord, SimRequest


class DecodeEngine:
    def __init__(
        self,
        node_id: str,
        loop: EventLoop,
        model: IterationModel,
        cfg: NodeConfig,
        on_first_token: Callable[[SimRequest, float], None],
        on_done: Callable[[SimRequest, float], None],
        records: list[RawRecord],
    ) -> None:
        self.node_id, self.loop, self.model, self.cfg = node_id, loop, model, cfg
        self.on_first_token, self.on_done, self.records = on_first_token, on_done, records
        self.waiting: deque[SimRequest] = deque()  # KV ready, FIFO
        self.transit: list[tuple[float, int, SimRequest]] = []  # KV still moving: (ready_at, seq, req)
        self._seq = 0
        self.batch: dict[int, SimRequest] = {}
        self._heap: list[tuple[int, int]] = []  # (finish_step, req_id)
        self.steps = 0
        self.ctx_sum = 0
        self.kv_used = 0
        self.busy_s = 0.0
        self._slope = max(0.0, (model.predict_decode_ms(1, 1e6) - model.predict_decode_ms(1, 0)) / 1e6)
        self._ver = 0
        self._seg: tuple[float, int, int, float, float, float] | None = None  # t0, k, B, f0, g, extra
        self._wake_pending = float("inf")  # idle: when the next KV in transit lands
        self.draining = False
        self.on_drained: Callable[[list[SimRequest], float], None] | None = None
        # Prefix tokens this node holds for a request now (>= its `cached`); None: no lookup.
        self.extend_cached: Callable[[SimRequest], int] | None = None

    # -- public --------------------------------------------------------------
    @property
    def queued(self) -> int:
        return len(self.waiting) + len(self.transit)

    @property
    def kv_usage(self) -> float:
        return min(1.0, self.kv_used / self.cfg.kv_capacity_tokens)

    def submit(self, sr: SimRequest) -> None:
        if sr.ready_at > self.loop.now:
            self._seq += 1
            heapq.heappush(self.transit, (sr.ready_at, self._seq, sr))
            if self._seg is not None:
                self._cut(sr.ready_at)  # admitted at the boundary of the iteration running then
            elif not self.draining:
                self._wake_at(sr.ready_at)
        else:
            self.waiting.append(sr)
            self._poke()

    def _wake_at(self, t: float) -> None:
        if t < self._wake_pending:
            self._wake_pending = t
            self.loop.at(t, self._wake)

    def _wake(self) -> None:
        self._wake_pending = float("inf")
        if self._seg is None and not self.draining:
            self._start(self.loop.now)

    def _matured(self, now: float) -> None:
        while self.transit and self.transit[0][0] <= now:
            self.waiting.append(heapq.heappop(self.transit)[2])

    def drain(self, on_drained: Callable[[list[SimRequest], float], None]) -> list[SimRequest]:
        """Stop admitting; at the next iteration boundary hand every running
        request (with `generated` updated) to `on_drained`. Returns the
        not-yet-admitted requests at once, for re-routing."""
        self.draining, self.on_drained = True, on_drained
        pending = list(self.waiting) + [x[2] for x in sorted(self.transit)]
        self.waiting.clear()
        self.transit.clear()
        if self._seg is None:
            self._finish_drain(self.loop.now)
        else:
            self._cut(self.loop.now)
        return pending

    # -- segments ------------------------------------------------------------
    def _T(self, k: int) -> float:
        assert self._seg is not None
        _, _, _, f0, g, extra = self._seg
        return extra + k * f0 + g * k * (k - 1) / 2

    def _poke(self) -> None:
        now = self.loop.now
        if self._seg is None:
            self._start(now)
        else:
            self._cut(now)

    def _cut(self, now: float) -> None:
        """End the running segment at the boundary of the iteration in
        progress at `now` (now or later), if that is before its end."""
        seg = self._seg
        assert seg is not None  # only called while a segment runs
        t0, k, blocks, f0, g, extra = seg
        elapsed = (now - t0) * 1000.0 - extra
        if g > 0:
            b = f0 - g / 2
            j = math.ceil((-b + math.sqrt(b * b + 2 * g * max(0.0, elapsed))) / g) if elapsed > 0 else 1
        else:
            j = math.ceil(elapsed / f0) if elapsed > 0 and f0 > 0 else 1
        j = max(1, j)
        while j > 1 and self._T(j - 1) >= elapsed + extra:
            j -= 1
        while self._T(j) < elapsed + extra:
            j += 1
        if j < k:
            self._seg = (t0, j, blocks, f0, g, extra)
            self._ver += 1
            self.loop.at(t0 + self._T(j) / 1000.0, self._boundary, self._ver)

    def _admit(self, now: float) -> float:
        extra_u = extra_c = extra_pair = 0
        load_ms = 0.0
        cap, max_batch = self.cfg.kv_capacity_tokens, self.cfg.max_batch
        w = self.waiting
        while w:
            sr = w[0]
            need = sr.req.prompt_tokens + sr.req.output_tokens
            if len(self.batch) >= max_batch or (self.batch and self.kv_used + need > cap):
                break
            w.popleft()
            self.kv_used += need
            self.ctx_sum += sr.context
            sr.join_step = self.steps
            sr.decode_node = self.node_id
            left = sr.req.output_tokens - sr.generated
            if sr.local_prefill:
                if self.extend_cached is not None:  # schedule-time prefix lookup (sim.node)
                    more = self.extend_cached(sr) - sr.cached
                    if more > 0:
                        sr.cached += more
                        load_ms += self.cfg.d2h_s(more) * 1000.0
                u = max(0, sr.req.prompt_tokens - sr.cached)
                extra_u += u
                extra_c += sr.cached
                extra_pair += u * (u + sr.cached)
                sr.extra["first_iter"] = 1.0
            sr.finish_step = self.steps + max(0, left)
            self.batch[sr.req.req_id] = sr
            heapq.heappush(self._heap, (sr.finish_step, sr.req.req_id))
        return (self.model.predict_prefill_ms(extra_u, extra_c, extra_pair) if extra_u else 0.0) + load_ms

    def _start(self, now: float) -> None:
        self._seg = None
        if self.draining:
            self._finish_drain(now)
            return
        self._matured(now)
        extra = self._admit(now)
        self._complete_zero(now)
        if not self.batch:
            if self.transit:
                self._wake_at(self.transit[0][0])
            return
        B = len(self.batch)
        k = max(1, self._heap[0][0] - self.steps)
        f0 = self.model.predict_decode_ms(B, self.ctx_sum)
        self._seg = (now, k, B, f0, self._slope * B, extra)
        if self.transit:  # KV still moving: stop for it at the iteration running when it lands
            self._cut(self.transit[0][0])
        if self._seg[1] == k:
            self._ver += 1
            self.loop.at(now + self._T(k) / 1000.0, self._boundary, self._ver)

    def _complete_zero(self, now: float) -> None:
        # Requests that need no decode iteration (output fully produced by prefill).
        while self._heap and self._heap[0][0] <= self.steps:
            _, rid = heapq.heappop(self._heap)
            self._release(self.batch.pop(rid), now)

    def _release(self, sr: SimRequest, now: float) -> None:
        self.kv_used -= sr.req.prompt_tokens + sr.req.output_tokens
        self.ctx_sum -= sr.req.prompt_tokens + sr.generated + (self.steps - sr.join_step)
        sr.generated += self.steps - sr.join_step
        self.on_done(sr, now)

    def _boundary(self, ver: int) -> None:
        if ver != self._ver or self._seg is None:
            return
        now = self.loop.now
        t0, k, B, f0, g, extra = self._seg
        total_ms = self._T(k)
        if extra:
            t1 = t0 + self._T(1) / 1000.0
            for sr in self.batch.values():
                if sr.extra.pop("first_iter", 0.0):
                    self.on_first_token(sr, t1)
        self.records.append(
            (self.node_id, Phase.DECODE, now, B, 0, 0, B, int(self.ctx_sum + B * (k - 1) / 2), (total_ms - extra) / k)
        )
        self.steps += k
        self.ctx_sum += B * k
        self.busy_s += total_ms / 1000.0
        self._seg = None
        while self._heap and self._heap[0][0] <= self.steps:
            _, rid = heapq.heappop(self._heap)
            self._release(self.batch.pop(rid), now)
        self._start(now)

    def _finish_drain(self, now: float) -> None:
        moving = []
        for sr in self.batch.values():
            sr.generated += self.steps - sr.join_step
            moving.append(sr)
        self.batch.clear()
        self._heap.clear()
        self.kv_used = self.ctx_sum = 0
        self._ver += 1
        cb, self.on_drained = self.on_drained, None
        self.draining = False
        if cb is not None:
            cb(moving, now)
