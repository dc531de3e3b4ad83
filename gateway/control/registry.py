"""Live worker registry: phases, health, load, and what the planner needs.

The registry is the gateway's in-memory truth about workers. It polls each
worker's `/internal/stats` (heartbeat), which also carries the iteration
records (buffered for the planner) and the blocks saved to / dropped from
the worker's host store (published to the KV directory).

Loop shape (`poll_once`): decide whom to poll -> one gather of stats calls
-> apply results. Health: a worker that fails `failures_to_unhealthy`
consecutive heartbeats, or that the orchestrator saw die (`report_failure`),
is unhealthy; its host-store blocks leave the directory (lost cache hits,
never wrong KV). A later successful heartbeat makes it healthy again.

Engine health (`gateway.control.health`): a heartbeat that reports the
worker's engine core dead (`WorkerStats.engine`), or a request the worker
refused or cut with `engine_dead` / `engine_died` (`report_engine_dead`),
takes the node out of routing and out of the planner's count at once. Its
blocks leave the directory too: the host store lives in the engine core's
process (the KV connector's worker half), so it died with the engine. A
heartbeat with the engine alive again (restarted in place by the worker, or
the process relaunched by the supervisor) brings the node back.

Draining is set by the switch orchestrator (`mark_draining`) before it asks
the worker to change phase, so the router stops sending at once; while it
drives the switch its mark wins over the heartbeat. A drain this replica
does not drive (another replica's order, its predecessor's as leader) is
the worker's to report: the heartbeat sets it and clears it.

Fencing (`workers.fence`): `term_source()` is the newest leadership term this
replica knows (its own while it leads, else the one it last read from the
lease). A worker whose heartbeat reports an older `fence_term` is told the
newer one (`POST /internal/fence`) right away, so a worker that restarted,
or that no order of the new leader has reached yet, refuses a deposed
leader's orders. `announce_term(term)` does it for every worker at once (a
new leader, before its first order).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any

from core import Phase
from gateway.control.health import NodeHealth, assess
from gateway.http.errors import NotFound
from gateway.kv.directory import Directory
from gateway.upstream.port import WorkerAPI, WorkerError
from planner.types import IterationRecord
from routing import NodeLoad
from workers.protocol import EngineState, KVPeerStats, WorkerStats

log = logging.getLogger(__name__)


@dataclass
class WorkerNode:
    node_id: str
    url: str
    phase: Phase = Phase.DECODE
    draining_to: Phase | None = None
    switching: bool = False  # this replica drives a switch of the node (`mark_draining`)
    healthy: bool = False
    failures: int = 0
    last_seen: float = 0.0
    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0
    tokens_per_s: float = 0.0
    block_size: int = 0
    max_model_len: int = 0  # the engine's context length (0: not reported)
    # The engine's limits as the worker reports them (0: unknown), for the planner.
    max_num_seqs: int = 0
    max_num_batched_tokens: int = 0
    kv_capacity_tokens: int = 0
    inflight: int = 0  # requests this gateway has open on the node
    next_iteration: int = 0
    kv_peers: tuple[KVPeerStats, ...] = ()  # the node's pulls from its peers (last heartbeat)
    block_bytes: int = 0  # bytes of one KV block in its host store (0: not reported)
    fence_term: int = 0  # newest leadership term the worker reported (workers.fence)
    refused_orders: int = 0  # orders it refused as stale
    health: NodeHealth = NodeHealth.UNREACHABLE  # `healthy` is health is HEALTHY
    engine: str = EngineState.ALIVE.value  # the engine state the worker last reported
    engine_error: str = ""  # why the engine died, as the worker says
    unhealthy_since: float | None = None  # clock time it left routing (None: healthy)
    started_at: float = 0.0  # the worker process's start time it reports
    restarts: int = 0  # times this gateway saw it come back as a new process
    engine_restarts: int = 0  # engine cores its current process restarted in place (workers.engine_heal)

    @property
    def draining(self) -> bool:
        return self.draining_to is not None

    @property
    def incarnation(self) -> tuple[int, int]:
        """(process restarts, engine restarts in place): changes whenever the node comes back as a new one."""
        return self.restarts, self.engine_restarts

    @property
    def running(self) -> int:
        """Requests running on the node. Between heartbeats the worker's own
        count lags; the gateway's in-flight count keeps a burst from piling
        onto one node."""
        return max(self.num_running, self.inflight)

    def load(self) -> NodeLoad:
        return NodeLoad(
            node_id=self.node_id,
            phase=self.phase,
            queue=self.num_waiting,
            running=self.running,
            kv_usage=self.kv_usage,
            draining=self.draining,
            healthy=self.healthy,
        )


class WorkerRegistry:
    def __init__(
        self,
        client: WorkerAPI,
        directory: Directory,
        *,
        failures_to_unhealthy: int = 3,
        iteration_buffer: int = 50_000,
        clock: Callable[[], float] = time.time,
        term_source: Callable[[], int | None] = lambda: None,
    ) -> None:
        self._client = client
        self.term_source = term_source
        self._directory = directory
        self._max_failures = failures_to_unhealthy
        self._clock = clock
        self._nodes: dict[str, WorkerNode] = {}
        self._background: set[asyncio.Task[object]] = set()
        self._iterations: collections.deque[IterationRecord] = collections.deque(maxlen=iteration_buffer)

    # -- membership ---------------------------------------------------------
    async def add(self, url: str) -> WorkerNode:
        """Register a worker by URL; its node id comes from its first heartbeat."""
        url = url.rstrip("/")
        for node in self._nodes.values():
            if node.url == url:
                return node
        node = WorkerNode(node_id=url, url=url)
        self._nodes[node.node_id] = node
        await self._poll(node)
        return node

    def nodes(self) -> list[WorkerNode]:
        return sorted(self._nodes.values(), key=lambda n: n.node_id)

    def find(self, node_id: str) -> WorkerNode | None:
        return self._nodes.get(node_id)

    def now(self) -> float:
        """The registry's clock (the one `unhealthy_since` is read on)."""
        return self._clock()

    def get(self, node_id: str) -> WorkerNode:
        node = self._nodes.get(node_id)
        if node is None:
            raise NotFound(f"unknown node {node_id!r}", code="node_not_found")
        return node

    def loads(self) -> list[NodeLoad]:
        return [n.load() for n in self._nodes.values()]

    def context_limit(self) -> int | None:
        """The context length every healthy worker can serve (None: none reported yet)."""
        lens = [n.max_model_len for n in self._nodes.values() if n.healthy and n.max_model_len > 0]
        return min(lens) if lens else None

    def healthy_count(self) -> int:
        return sum(1 for n in self._nodes.values() if n.healthy)

    # -- state set by the orchestrator / switcher -----------------------------
    def mark_draining(self, node_id: str, to_phase: Phase) -> None:
        node = self.get(node_id)
        node.draining_to, node.switching = to_phase, True

    def finish_switch(self, node_id: str, phase: Phase) -> None:
        node = self.get(node_id)
        node.phase = phase
        node.draining_to, node.switching = None, False

    def release_switch(self, node_id: str) -> None:
        """This replica no longer drives the node's switch (done, failed or
        cancelled): from now on the heartbeat says where the node is."""
        node = self.find(node_id)
        if node is not None:
            node.switching = False

    def report_failure(self, node_id: str, why: str, *, certain: bool = True) -> None:
        """The orchestrator could not reach the node. `certain` (connection
        refused): dead now. Otherwise (a timeout, a broken stream from a busy
        node) it counts like a missed heartbeat."""
        node = self._nodes.get(node_id)
        if node is None or not node.healthy:
            return
        if not certain:
            node.failures += 1
            if node.failures < self._max_failures:
                return
        log.warning("worker %s marked unhealthy: %s", node_id, why)
        node.failures = max(node.failures, self._max_failures)
        self._set_health(node, NodeHealth.UNREACHABLE)
        self._spawn(self._directory.drop_node(node_id))

    def report_engine_dead(self, node_id: str, why: str) -> None:
        """The worker answered that its engine core is dead: out of routing now,
        without waiting for the next heartbeat."""
        node = self._nodes.get(node_id)
        if node is None or node.health is NodeHealth.ENGINE_DEAD:
            return
        log.warning("worker %s engine dead: %s", node_id, why)
        node.engine, node.engine_error = EngineState.DEAD.value, why
        was_healthy = node.healthy
        self._set_health(node, NodeHealth.ENGINE_DEAD)
        if was_healthy:
            self._spawn(self._directory.drop_node(node_id))

    def _set_health(self, node: WorkerNode, health: NodeHealth) -> None:
        if health is node.health:
            return
        node.health = health
        node.healthy = health is NodeHealth.HEALTHY
        node.unhealthy_since = None if node.healthy else self._clock()

    @contextlib.contextmanager
    def track(self, node_id: str) -> Iterator[None]:
        node = self._nodes.get(node_id)
        if node is not None:
            node.inflight += 1
        try:
            yield
        finally:
            if node is not None:
                node.inflight -= 1

    def _spawn(self, coro: Coroutine[Any, Any, object]) -> None:
        """Run `coro` in the background (the directory call of a sync state change)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- heartbeat --------------------------------------------------------------
    async def poll_once(self) -> None:
        await asyncio.gather(*(self._poll(n) for n in list(self._nodes.values())))

    async def announce_term(self, term: int) -> int:
        """Tell every healthy worker the newest term; returns how many confirmed it."""

        async def one(node: WorkerNode) -> bool:
            try:
                return (await self._client.fence(node.url, term)).term >= term
            except WorkerError as exc:
                log.warning("could not announce term %d to %s: %s", term, node.node_id, exc)
                return False

        done = await asyncio.gather(*(one(n) for n in list(self._nodes.values()) if n.healthy))
        return sum(done)

    async def _poll(self, node: WorkerNode) -> None:
        asked = self._clock()
        try:
            stats = await self._client.stats(node.url, since=node.next_iteration)
        except WorkerError as exc:
            node.failures += 1
            was_healthy = node.healthy
            health = assess(
                node.health, answered=False, engine_alive=False, failures=node.failures, max_failures=self._max_failures
            )
            self._set_health(node, health)
            if was_healthy and not node.healthy:
                log.warning("worker %s missed %d heartbeats: %s", node.node_id, node.failures, exc)
                await self._directory.drop_node(node.node_id)
            return
        if (
            node.health is NodeHealth.ENGINE_DEAD
            and stats.engine is EngineState.ALIVE
            and node.unhealthy_since is not None
            and asked < node.unhealthy_since
        ):
            return  # asked before a request saw the engine die: stale, not a revival
        await self._apply(node, stats)
        term = self.term_source()
        if term is not None and stats.fence_term < term:
            try:
                await self._client.fence(node.url, term)
            except WorkerError as exc:
                log.warning("could not tell %s the leadership term %d: %s", node.node_id, term, exc)

    async def _apply(self, node: WorkerNode, stats: WorkerStats) -> None:
        if stats.node_id != node.node_id:
            self._nodes.pop(node.node_id, None)
            node.node_id = stats.node_id
            self._nodes[node.node_id] = node
        was_healthy = node.healthy
        node.failures, node.last_seen = 0, self._clock()
        node.engine, node.engine_error = stats.engine.value, stats.engine_error
        if stats.started_at and node.started_at and stats.started_at != node.started_at:
            node.restarts += 1
            log.warning("worker %s restarted (a new process)", node.node_id)
        node.started_at = stats.started_at or node.started_at
        node.engine_restarts = stats.engine_restarts
        alive = stats.engine is EngineState.ALIVE
        self._set_health(node, assess(node.health, answered=True, engine_alive=alive, failures=0, max_failures=1))
        if not alive:
            if was_healthy:
                log.warning("worker %s reports its engine %s: %s", node.node_id, stats.engine.value, stats.engine_error)
                await self._directory.drop_node(node.node_id)
            return  # nothing it reports now is about a serving engine
        if not node.switching or stats.draining_to is not None:
            # While this replica drives a switch its own mark wins; else the worker's report does.
            node.phase, node.draining_to = stats.phase, stats.draining_to
        node.num_running, node.num_waiting = stats.num_running, stats.num_waiting
        node.fence_term, node.refused_orders = stats.fence_term, stats.refused_orders
        node.kv_usage, node.tokens_per_s, node.block_size = stats.kv_usage, stats.tokens_per_s, stats.block_size
        node.max_model_len = stats.max_model_len
        node.max_num_seqs, node.max_num_batched_tokens = stats.max_num_seqs, stats.max_num_batched_tokens
        node.kv_capacity_tokens = stats.kv_capacity_tokens
        node.kv_peers = tuple(stats.kv_peers)
        node.block_bytes = stats.host_store.block_bytes
        if stats.block_size and stats.block_size != self._directory.block_size and not was_healthy:
            # Hashes would never match: every lookup misses (correct but no cache hits).
            log.error(
                "worker %s uses block size %d, the gateway %d: set EVOLVING_BLOCK_SIZE",
                node.node_id,
                stats.block_size,
                self._directory.block_size,
            )
        if not was_healthy:
            log.info("worker %s healthy at %s (%s)", node.node_id, node.url, node.phase.value)
        if stats.saved_blocks:
            await self._directory.publish(node.node_id, stats.saved_blocks, stats.host_store.block_bytes)
        if stats.dropped_blocks:
            await self._directory.unpublish(node.node_id, [b.block_hash for b in stats.dropped_blocks])
        for it in stats.iterations:
            self._iterations.append(
                IterationRecord(
                    node_id=node.node_id,
                    phase=it.phase,
                    t=it.t,
                    batch_size=it.batch_size,
                    uncached_prompt_tokens=it.uncached_prompt_tokens,
                    cached_prompt_tokens=it.cached_prompt_tokens,
                    generated_tokens=it.generated_tokens,
                    context_tokens=it.context_tokens,
                    elapsed_ms=it.elapsed_ms,
                    attention_pairs=it.attention_pairs,
                    cpu_share=it.cpu_share,
                    host_probe_us=it.host_probe_us,
                )
            )
            node.next_iteration = max(node.next_iteration, it.index + 1)

    def drain_iterations(self) -> list[IterationRecord]:
        """Every buffered iteration record, oldest first; the buffer is emptied."""
        out = list(self._iterations)
        self._iterations.clear()
        return out

    async def run(self, interval_s: float) -> None:
        """Heartbeat forever (cancel to stop)."""
        while True:
            await self.poll_once()
            await asyncio.sleep(interval_s)
