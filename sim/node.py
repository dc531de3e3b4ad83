"""A simulated dual-phase node: prefill engine, decode engine, phase state.

Prefill: FCFS chunked prefill with a token budget per iteration; a job whose
prefix KV is still being pulled (async prefetch, `ready_at` in the future) is
skipped, like vLLM's WAITING_FOR_REMOTE_KVS, and the node idles only if no
job is ready. A job's cached prefix is looked up again on its node when the
scheduler first reaches it (`extend_cached`), as vLLM's scheduler asks its
prefix cache and the pool connector (`get_num_new_matched_tokens`) at
scheduling time, not at arrival: blocks an earlier job computed on this node
while this one queued are hits, loaded from the node's host store first
(the decode engine does the same for a prompt it computes itself). Blocks
become visible when the job that computed them finishes its prefill, not
chunk by chunk as in vLLM. With `layerwise_kv` the pull happens inside the
job's first chunk instead: the iteration takes compute + transfer and the
transfer part counts as idle GPU time.

Phase lifecycle (one transition table): SERVING -> DRAINING -> SERVING(new
phase) for in-place switches; SERVING -> OFFLINE -> SERVING for relaunches.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable

from core import Phase
from routing.scorers import NodeLoad
from sim.decode import DecodeEngine
from sim.events import EventLoop
from sim.state import IterationModel, NodeConfig, RawRecord, SimRequest


class NodeStatus(str, enum.Enum):
    SERVING = "serving"
    DRAINING = "draining"
    OFFLINE = "offline"


TRANSITIONS = {
    NodeStatus.SERVING: {NodeStatus.DRAINING, NodeStatus.OFFLINE},
    NodeStatus.DRAINING: {NodeStatus.SERVING, NodeStatus.OFFLINE},
    NodeStatus.OFFLINE: {NodeStatus.SERVING},
}


class _Job:
    __slots__ = ("sr", "left", "done", "started", "looked_up")

    def __init__(self, sr: SimRequest) -> None:
        self.sr = sr
        self.left = max(0, sr.req.prompt_tokens - sr.cached)
        self.done = 0
        self.started = False
        self.looked_up = False  # the schedule-time prefix lookup is done


class PrefillEngine:
    def __init__(
        self,
        node_id: str,
        loop: EventLoop,
        model: IterationModel,
        cfg: NodeConfig,
        on_done: Callable[[SimRequest, float], None],
        records: list[RawRecord],
    ) -> None:
        self.node_id, self.loop, self.model, self.cfg = node_id, loop, model, cfg
        self.on_done, self.records = on_done, records
        self.queue: deque[_Job] = deque()
        self.running = False
        self.waiting = 0  # jobs not finished (queue length as the router sees it)
        self.compute_s = 0.0
        self.stall_s = 0.0
        self._wake_pending = float("inf")
        self.on_empty: Callable[[float], None] | None = None
        # Prefix tokens this node holds for a request now (>= its `cached`); None: no lookup.
        self.extend_cached: Callable[[SimRequest], int] | None = None

    def submit(self, sr: SimRequest) -> None:
        self.queue.append(_Job(sr))
        self.waiting += 1
        if not self.running:
            self._step()

    def take_unstarted(self) -> list[SimRequest]:
        """Remove and return jobs that have not computed a token yet (drain)."""
        out = [j.sr for j in self.queue if not j.started and j.left > 0]
        self.queue = deque(j for j in self.queue if j.started and j.left > 0)
        self.waiting -= len(out)
        return out

    def _step(self) -> None:  # noqa: C901 - the simulator's hot loop, kept in one frame for speed
        now = self.loop.now
        q = self.queue
        while q and q[0].left <= 0:
            q.popleft()
        budget = self.cfg.chunk_tokens
        chunk: list[tuple[_Job, int]] = []
        wake = float("inf")
        u = c = pair = 0
        stall = 0.0
        for job in q:
            if budget <= 0:
                break
            if job.left <= 0:
                continue
            if not job.looked_up:
                job.looked_up = True
                if self._extend(job, now):
                    wake = min(wake, job.sr.ready_at)
                    continue
            if job.sr.ready_at > now:
                wake = min(wake, job.sr.ready_at)
                continue
            n = min(job.left, budget)
            if not job.started and self.cfg.layerwise_kv:
                stall += job.sr.stall_s
            chunk.append((job, n))
            ctx = job.sr.cached + job.done
            u += n
            c += ctx
            pair += n * (n + ctx)  # attention is per request: no cross terms between the chunk's jobs
            budget -= n
        if not chunk:
            self.running = False
            if wake < float("inf"):
                if wake < self._wake_pending:
                    self._wake_pending = wake
                    self.loop.at(wake, self._wake)
            elif self.on_empty is not None:
                self.queue.clear()
                self.on_empty(now)
            return
        self.running = True
        compute = self.model.predict_prefill_ms(u, c, pair) / 1000.0
        self.compute_s += compute
        self.stall_s += stall
        self.records.append(
            (
                self.node_id,
                Phase.PREFILL,
                now + compute + stall,
                len(chunk),
                u,
                c,
                0,
                0,
                (compute + stall) * 1000.0,
                pair,
            )
        )
        for job, _ in chunk:
            job.started = True
        self.loop.at(now + compute + stall, self._end, chunk)

    def _extend(self, job: _Job, now: float) -> bool:
        """Schedule-time lookup: prefix tokens computed on this node since the
        job was routed become cached, loaded from the host store before the
        job runs (True: it now waits for that load)."""
        if self.extend_cached is None or job.started:
            return False
        sr = job.sr
        more = self.extend_cached(sr) - sr.cached
        if more <= 0:
            return False
        sr.cached += more
        job.left = max(0, job.left - more)
        if self.cfg.layerwise_kv:  # loaded inside the first chunk, like the rest of its prefix
            sr.stall_s += self.cfg.d2h_s(more)
            return False
        sr.ready_at = max(sr.ready_at, now + self.cfg.d2h_s(more))
        return sr.ready_at > now

    def _wake(self) -> None:
        self._wake_pending = float("inf")
        if not self.running:
            self._step()

    def _end(self, chunk: list[tuple[_Job, int]]) -> None:
        now = self.loop.now
        finished = []
        for job, n in chunk:
            job.left -= n
            job.done += n
            if job.left <= 0:
                finished.append(job.sr)
                self.waiting -= 1
        self.running = False
        for sr in finished:
            self.on_done(sr, now)
        self._step()


class SimNode:
    """One node; `phase` says which engine takes new work."""

    def __init__(
        self,
        node_id: str,
        phase: Phase,
        loop: EventLoop,
        model: IterationModel,
        cfg: NodeConfig,
        on_prefill_done: Callable[[SimRequest, float], None],
        on_first_token: Callable[[SimRequest, float], None],
        on_decode_done: Callable[[SimRequest, float], None],
        records: list[RawRecord],
    ) -> None:
        self.node_id = node_id
        self.phase = phase
        self.status = NodeStatus.SERVING
        self.draining_to: Phase | None = None
        self.cfg = cfg
        self._kv_capacity = cfg.kv_capacity_tokens
        self.prefill = PrefillEngine(node_id, loop, model, cfg, on_prefill_done, records)
        self.decode = DecodeEngine(node_id, loop, model, cfg, on_first_token, on_decode_done, records)
        self.phase_since = 0.0
        self.on_change: Callable[[], None] | None = None  # told when status or phase changes
        self.prefill_phase_s = 0.0  # time spent serving as a prefill node (for idle fraction)

    def set_status(self, status: NodeStatus) -> None:
        if status not in TRANSITIONS[self.status]:
            raise ValueError(f"{self.node_id}: {self.status.value} -> {status.value} not allowed")
        self.status = status
        if self.on_change is not None:
            self.on_change()

    @property
    def accepting(self) -> bool:
        return self.status is NodeStatus.SERVING

    def set_phase(self, phase: Phase, now: float) -> None:
        self.close_phase_clock(now)
        self.phase = phase
        if self.on_change is not None:
            self.on_change()

    def close_phase_clock(self, now: float) -> None:
        if self.phase is Phase.PREFILL and self.status is NodeStatus.SERVING:
            self.prefill_phase_s += now - self.phase_since
        self.phase_since = now

    def load(self) -> NodeLoad:
        """What the router and the planner see of this node: queue and running
        of its current phase, decode KV use. The one place these are defined."""
        dec = self.decode
        kv = dec.kv_used / self._kv_capacity  # dec.kv_usage, inline: the router reads ~12 loads per request
        if kv > 1.0:
            kv = 1.0
        if self.phase is Phase.PREFILL:
            pre = self.prefill
            return NodeLoad(self.node_id, Phase.PREFILL, pre.waiting, 1 if pre.running else 0, kv)
        return NodeLoad(self.node_id, Phase.DECODE, len(dec.waiting) + len(dec.transit), len(dec.batch), kv)

    @property
    def queue(self) -> int:
        return self.load().queue

    @property
    def running(self) -> int:
        return self.load().running
