"""A fake dual-phase worker speaking `workers.protocol`, in memory.

Used by the gateway's unit tests (through `InProcessWorkerClient`), by the
integration tests and by `bench gateway` (through `testing.fake_worker_app`).

Behaviour, all deterministic:
- Greedy "model": the next token is a function of the whole context
  (`next_token`), so a request resumed elsewhere with prompt + generated
  tokens continues exactly as an unmigrated run would.
- PREFILL returns one token and the prompt's full blocks (`saved_blocks`).
- DECODE streams one token per chunk, `token_delay_s` apart.
- `change_phase` drains prefills, then (after `deadline_s`) ends every
  in-flight decode with finish_reason "migrated" and the blocks of
  prompt + generated tokens, then flips.
- `kill()` makes the node dead: open streams break, every call fails.
- `kill_engine()` kills only the engine (the process lives, as when vLLM's
  EngineCore dies): open streams end with an "error" chunk of type
  "engine_died", new requests get 503 "engine_dead", stats report it, and
  the host store is gone. `poison` names requests that kill the engine
  when they run (a poison request); `restart_engine()` brings it back.
  `death_cut_s` set: the streams open on a dying engine are cut without
  a word that long after the death instead (the real worker's answer can
  come after its heartbeat told the gateway).
- Fencing as the real worker (`workers.fence.TermFence`): a phase change or
  migrate order of an older term than the newest seen raises
  `WorkerRejected` 409 "stale_term"; `switch_delay_s` makes every phase
  change take at least that long (an order that is still running when a
  test pauses the gateway that sent it).
- Logprobs, when asked for: the sampled token at -0.5 and alternatives
  next to it at -1.5, -2.5, ... (fixed values the gateway's formatting can
  be checked against).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

from core import Phase, Role
from gateway.kv.directory import BlockHasher, default_block_hasher
from gateway.upstream.port import ChunkLane, WorkerRejected, WorkerUnreachable
from workers.fence import StaleTerm, TermFence
from workers.protocol import (
    ENGINE_DEAD,
    ENGINE_DIED,
    WRONG_PHASE,
    AbortResponse,
    BlockLocation,
    EngineState,
    FenceStatus,
    GenerateChunk,
    GenerateRequest,
    HostStoreStats,
    IterationRecordWire,
    MigrateRequest,
    MigrateResponse,
    PhaseChangeRequest,
    PhaseChangeResult,
    PhaseStatus,
    TokenLogprobs,
    WorkerStats,
)


def next_token(context: Sequence[int], lo: int, hi: int) -> int:
    """The fake model: a pure function of the context, in [lo, hi)."""
    return lo + (context[-1] * 31 + len(context) * 17) % (hi - lo)


def fake_logprobs(token_id: int, k: int, hi: int) -> TokenLogprobs:
    return TokenLogprobs(token_id=token_id, logprob=-0.5, top=[((token_id + i) % hi, -0.5 - i) for i in range(k)])


@dataclass
class _Running:
    req: GenerateRequest
    migrate: bool = False
    abort: bool = False


@dataclass
class FakeWorker:
    node_id: str
    phase: Phase = Phase.DECODE
    token_range: tuple[int, int] = (300, 1300)
    eos_token_id: int | None = None
    token_delay_s: float = 0.0
    block_size: int = 16
    max_model_len: int = 0  # reported in stats (0: not reported, the gateway then knows no limit)
    hasher: BlockHasher = field(default_factory=default_block_hasher)
    dead: bool = False
    engine_dead: bool = False
    engine_restarts: int = 0  # engines restarted in place (`restart_engine`), as a worker's stats report them
    poison: Callable[[GenerateRequest], bool] | None = None  # requests that kill the engine when they run
    death_cut_s: float | None = None  # set: a dying engine's streams are cut this long after, no error chunk
    draining_to: Phase | None = None
    switch_delay_s: float = 0.0
    fence: TermFence = field(default_factory=TermFence)
    # (term, from, to, unix time it was accepted) of every phase change carried out, in order
    switches: list[tuple[int | None, Phase, Phase, float]] = field(default_factory=list)
    requests: list[GenerateRequest] = field(default_factory=list)
    _running: dict[str, _Running] = field(default_factory=dict)
    _slots: int = 0
    _store: dict[str, int] = field(default_factory=dict)
    _saved: list[BlockLocation] = field(default_factory=list)
    _iterations: list[IterationRecordWire] = field(default_factory=list)
    _clock: Callable[[], float] = time.time

    # -- failure injection ------------------------------------------------
    def kill(self) -> None:
        self.dead = True

    def _check_alive(self) -> None:
        if self.dead:
            raise WorkerUnreachable(f"{self.node_id}: connection refused")

    def kill_engine(self) -> None:
        self.engine_dead = True
        self._store.clear()  # the host store lived in the engine's process

    def restart_engine(self) -> None:
        self.engine_dead = False
        self.engine_restarts += 1

    # -- generation ---------------------------------------------------------
    def _save_blocks(self, token_ids: Sequence[int], salt: str) -> list[BlockLocation]:
        out = []
        for h in self.hasher(token_ids, self.block_size, salt):
            if h not in self._store:
                self._store[h] = self._slots
                self._slots += 1
                self._saved.append(BlockLocation(block_hash=h, node_id=self.node_id, slot=self._store[h]))
            out.append(BlockLocation(block_hash=h, node_id=self.node_id, slot=self._store[h]))
        return out

    def _cached_tokens(self, req: GenerateRequest) -> int:
        loaded = len(req.kv.load) if req.kv else 0
        own = 0
        for h in self.hasher(req.prompt_token_ids, self.block_size, req.tenant_salt):
            if h not in self._store:
                break
            own += 1
        blocks = max(loaded, own)
        return min(blocks * self.block_size, len(req.prompt_token_ids) - 1)

    def _admit(self, req: GenerateRequest) -> None:
        self._check_alive()
        if self.engine_dead:
            raise WorkerRejected(
                f"worker HTTP 503: {self.node_id} engine dead",
                status=503,
                retryable=True,
                detail="the engine core has stopped",
                error_type=ENGINE_DEAD,
            )
        if self.draining_to is not None and req.role is not Role(self.draining_to.value):
            # As a real worker (workers.phase.accepts): a draining node takes its target's role only.
            raise WorkerRejected(
                f"worker {WRONG_PHASE}: {self.node_id} is draining to {self.draining_to.value}",
                status=409,
                retryable=True,
                error_type=WRONG_PHASE,
            )
        if req.request_id in self._running:
            raise WorkerRejected(f"duplicate request id {req.request_id}", status=409, retryable=False)
        self.requests.append(req)

    async def generate_stream(self, req: GenerateRequest) -> AsyncGenerator[GenerateChunk, None]:
        self._admit(req)
        state = self._running[req.request_id] = _Running(req)
        context = list(req.prompt_token_ids)
        lo, hi = self.token_range
        cached = self._cached_tokens(req)
        base = {"request_id": req.request_id, "prompt_tokens": len(context), "cached_tokens": cached}
        max_tokens = 1 if req.role is Role.PREFILL else req.sampling.max_tokens
        try:
            for i in range(max_tokens):
                if self.token_delay_s:
                    await asyncio.sleep(self.token_delay_s)
                else:
                    await asyncio.sleep(0)
                self._check_alive()
                if self.poison is not None and self.poison(req):
                    self.kill_engine()
                if self.engine_dead:
                    if self.death_cut_s is not None:
                        await asyncio.sleep(self.death_cut_s)
                        return
                    yield GenerateChunk(
                        **base, finish_reason="error", error="the engine core has stopped", error_type=ENGINE_DIED
                    )
                    return
                if state.abort:
                    yield GenerateChunk(**base, finish_reason="abort")
                    return
                if state.migrate:
                    saved = self._save_blocks(context, req.tenant_salt)
                    yield GenerateChunk(**base, finish_reason="migrated", saved_blocks=saved)
                    return
                tok = next_token(context, lo, hi)
                context.append(tok)
                lps = [fake_logprobs(tok, req.sampling.logprobs, hi)] if req.sampling.logprobs is not None else None
                if tok == self.eos_token_id:
                    yield GenerateChunk(**base, token_ids=[tok], finish_reason="stop", logprobs=lps)
                    return
                last = i == max_tokens - 1
                if last and req.role is Role.PREFILL:
                    saved = (
                        self._save_blocks(req.prompt_token_ids, req.tenant_salt)
                        if (req.kv is None or req.kv.save)
                        else []
                    )
                    yield GenerateChunk(
                        **base, token_ids=[tok], finish_reason="length", saved_blocks=saved, logprobs=lps
                    )
                    return
                yield GenerateChunk(**base, token_ids=[tok], finish_reason="length" if last else None, logprobs=lps)
        finally:
            self._running.pop(req.request_id, None)
            self._record(req, context)

    def _record(self, req: GenerateRequest, context: list[int]) -> None:
        generated = len(context) - len(req.prompt_token_ids)
        self._iterations.append(
            IterationRecordWire(
                index=len(self._iterations),
                t=self._clock(),
                phase=self.phase,
                batch_size=1,
                uncached_prompt_tokens=len(req.prompt_token_ids),
                cached_prompt_tokens=0,
                generated_tokens=generated,
                context_tokens=len(context),
                elapsed_ms=1.0,
            )
        )

    async def generate(self, req: GenerateRequest) -> GenerateChunk:
        tokens: list[int] = []
        last: GenerateChunk | None = None
        async for chunk in self.generate_stream(req):
            tokens.extend(chunk.token_ids)
            last = chunk
        assert last is not None
        if last.error_type == ENGINE_DIED:  # the real worker answers a non-streamed call with 503
            raise WorkerRejected(
                f"worker HTTP 503: {last.error}", status=503, retryable=True, detail=last.error, error_type=ENGINE_DIED
            )
        return last.model_copy(update={"token_ids": tokens})

    # -- control ------------------------------------------------------------
    def abort(self, request_id: str) -> AbortResponse:
        self._check_alive()
        state = self._running.get(request_id)
        if state is not None:
            state.abort = True
        return AbortResponse(request_id=request_id, aborted=state is not None)

    def _admit_order(self, term: int | None) -> None:
        try:
            self.fence.admit(term)
        except StaleTerm as exc:
            raise WorkerRejected(
                f"worker stale_term: {exc}", status=409, retryable=False, error_type="stale_term"
            ) from None

    def fence_status(self, term: int | None = None) -> FenceStatus:
        self._check_alive()
        self.fence.observe(term)
        f = self.fence
        return FenceStatus(node_id=self.node_id, term=f.newest, accepted_orders=f.accepted, refused_orders=f.refused)

    def migrate(self, req: MigrateRequest, *, fenced: bool = True) -> MigrateResponse:
        self._check_alive()
        if fenced:
            self._admit_order(req.term)
        ids = req.request_ids or [r for r, s in self._running.items() if s.req.role is Role.DECODE]
        for rid in ids:
            if rid in self._running:
                self._running[rid].migrate = True
        return MigrateResponse(migrated=[r for r in ids if r in self._running])

    def phase_status(self) -> PhaseStatus:
        self._check_alive()
        roles = [s.req.role for s in self._running.values()]
        return PhaseStatus(
            node_id=self.node_id,
            phase=self.phase,
            draining_to=self.draining_to,
            inflight_prefill=roles.count(Role.PREFILL),
            inflight_decode=roles.count(Role.DECODE),
        )

    async def change_phase(self, req: PhaseChangeRequest) -> PhaseChangeResult:
        self._check_alive()
        self._admit_order(req.term)
        accepted_at = self._clock()
        start = time.monotonic()
        from_phase = self.phase
        self.draining_to = req.phase
        try:
            while any(s.req.role is Role.PREFILL for s in self._running.values()):
                await asyncio.sleep(0.001)
            drained = time.monotonic()
            deadline = drained + req.deadline_s
            while self._running and time.monotonic() < deadline:
                await asyncio.sleep(0.001)
            migrated = self.migrate(MigrateRequest(), fenced=False).migrated if req.migrate else []
            if not req.migrate:
                for s in self._running.values():
                    s.abort = True
            while self._running:
                await asyncio.sleep(0.001)
            rest = self.switch_delay_s - (time.monotonic() - start)
            if rest > 0:
                await asyncio.sleep(rest)
            self.switches.append((req.term, self.phase, req.phase, accepted_at))
            self.phase = req.phase
        finally:
            self.draining_to = None
        end = time.monotonic()
        return PhaseChangeResult(
            node_id=self.node_id,
            from_phase=from_phase,
            to_phase=req.phase,
            drain_s=drained - start,
            migrate_s=end - drained,
            total_s=end - start,
            migrated=migrated,
        )

    def stats(self, since: int = 0) -> WorkerStats:
        self._check_alive()
        roles = [s.req.role for s in self._running.values()]
        saved, self._saved = self._saved, []
        return WorkerStats(
            node_id=self.node_id,
            phase=self.phase,
            draining_to=self.draining_to,
            num_running=len(roles),
            num_waiting=0,
            kv_usage=min(1.0, len(roles) / 64),
            block_size=self.block_size,
            max_model_len=self.max_model_len,
            host_store=HostStoreStats(capacity_blocks=1 << 20, used_blocks=len(self._store), block_bytes=4096),
            iterations=[r for r in self._iterations if r.index >= since],
            saved_blocks=saved,
            fence_term=self.fence.newest,
            refused_orders=self.fence.refused,
            engine=EngineState.DEAD if self.engine_dead else EngineState.ALIVE,
            engine_error="the engine core has stopped" if self.engine_dead else "",
            engine_restarts=self.engine_restarts,
        )


async def _offered(chunks: AsyncGenerator[GenerateChunk, None], lane: ChunkLane) -> AsyncIterator[GenerateChunk]:
    """`chunks` with each one offered to `lane` first, while the caller waits
    for its next chunk (as the raw client offers them): those it refuses are yielded."""
    async with contextlib.aclosing(chunks):
        async for chunk in chunks:
            if not lane(chunk):
                yield chunk


class InProcessWorkerClient:
    """`gateway.upstream.port.WorkerAPI` over FakeWorkers in this process (url -> worker)."""

    def __init__(self, workers: dict[str, FakeWorker]) -> None:
        self.workers = workers

    def _w(self, url: str) -> FakeWorker:
        worker = self.workers.get(url)
        if worker is None:
            raise WorkerUnreachable(f"{url}: no such worker")
        return worker

    def generate_stream(
        self, url: str, req: GenerateRequest, *, lane: ChunkLane | None = None
    ) -> AsyncIterator[GenerateChunk]:
        chunks = self._w(url).generate_stream(req)
        return chunks if lane is None else _offered(chunks, lane)

    async def generate(self, url: str, req: GenerateRequest) -> GenerateChunk:
        return await self._w(url).generate(req)

    async def abort(self, url: str, request_id: str) -> AbortResponse:
        return self._w(url).abort(request_id)

    async def migrate(self, url: str, req: MigrateRequest) -> MigrateResponse:
        return self._w(url).migrate(req)

    async def phase(self, url: str) -> PhaseStatus:
        return self._w(url).phase_status()

    async def change_phase(self, url: str, req: PhaseChangeRequest, *, timeout_s: float) -> PhaseChangeResult:
        return await asyncio.wait_for(self._w(url).change_phase(req), timeout_s)

    async def stats(self, url: str, since: int = 0) -> WorkerStats:
        return self._w(url).stats(since)

    async def fence(self, url: str, term: int) -> FenceStatus:
        return self._w(url).fence_status(term)

    async def ready(self, url: str) -> bool:
        return url in self.workers and not self.workers[url].dead

    async def aclose(self) -> None:
        return None
