"""The worker's HTTP server: the internal API of workers/protocol.py.

Thin shell: each handler validates (pydantic), asks the phase machine, calls
the engine, and turns failures into `ErrorResponse`s. The phase change reads
as decide -> drain/migrate -> flip.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import pathlib
import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from core import FinishReason, Phase
from kvpool.agent_info import AgentInfo
from workers import phase as ph
from workers.engine import EngineConfig, EngineError, WorkerEngine
from workers.engine_heal import EngineHealer
from workers.fence import StaleTerm
from workers.protocol import (
    ENGINE_DEAD,
    WRONG_PHASE,
    AbortRequest,
    AbortResponse,
    BlockLocation,
    EngineState,
    ErrorBody,
    ErrorResponse,
    FenceRequest,
    FenceStatus,
    GenerateChunk,
    GenerateRequest,
    HostStoreStats,
    KVAgentInfo,
    MigrateRequest,
    MigrateResponse,
    PhaseChangeRequest,
    PhaseStatus,
    RequestTimingWire,
    WorkerStats,
)
from workers.restart_policy import RestartPolicy
from workers.switch import WorkerState, change_phase
from workers.telemetry import WorkerTracing


def _error(status: int, type_: str, message: str, retryable: bool = False) -> JSONResponse:
    body = ErrorResponse(error=ErrorBody(type=type_, message=message, retryable=retryable))
    return JSONResponse(body.model_dump(), status_code=status)


def create_app(  # noqa: C901 - a route table: each handler is its own small function
    config: EngineConfig,
    initial_phase: Phase,
    *,
    cluster_token: str | None = None,
    engine: WorkerEngine | None = None,
    tracing: WorkerTracing | None = None,
    engine_restarts: RestartPolicy | None = None,
) -> FastAPI:
    """`engine_restarts`: how a dead engine core is restarted inside this
    process (default `RestartPolicy(base_delay_s=0.2)`; `max_restarts=0`:
    never, the process supervisor relaunches the worker)."""
    started_at = time.time()  # reported in stats: the gateway counts a new value as a restart
    holder: dict[str, WorkerState] = {}
    tracing = tracing or WorkerTracing.off()
    eng = engine or WorkerEngine(config, phase_of=lambda: holder["w"].phase, tracing=tracing)
    holder["w"] = ws = WorkerState(eng, initial_phase)
    tracing.block_bytes = lambda: _store_stats(ws, config).block_bytes  # a pull span's bytes
    healer = EngineHealer(eng, engine_restarts or RestartPolicy(base_delay_s=0.2))

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        await eng.start()
        healing = asyncio.create_task(healer.run()) if healer.policy.max_restarts else None
        try:
            yield
        finally:
            if healing is not None:
                healing.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await healing
            await eng.stop()
            tracing.shutdown()

    app = FastAPI(title="evolving-infra worker", lifespan=lifespan)
    app.state.worker = ws
    app.state.healer = healer

    @app.middleware("http")
    async def _cluster_auth(request: Request, call_next):
        if cluster_token and request.url.path.startswith("/internal"):
            got = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
            if not hmac.compare_digest(got, cluster_token):
                return _error(401, "authentication_error", "missing or wrong cluster token")
        return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return _error(400, "invalid_request", f"{where}: {first.get('msg', 'invalid body')}")

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException):
        # e.g. a body that is not JSON at all: same error shape as the rest.
        return _error(exc.status_code, "invalid_request" if exc.status_code < 500 else "server_error", str(exc.detail))

    @app.get("/healthz")
    async def healthz():
        # The liveness probe: a process whose engine core died and is not
        # being restarted in place is not alive (Kubernetes and `up` restart
        # the process); a starting or restarting one is.
        state = healer.state()
        if state is EngineState.DEAD:
            return _error(503, ENGINE_DEAD, eng.dead_reason, retryable=True)
        return {"status": "ok", "engine": state.value, "engine_restarts": eng.restarts}

    @app.get("/readyz")
    async def readyz():
        if eng.state in (EngineState.DEAD, EngineState.RESTARTING):
            return _error(503, ENGINE_DEAD, eng.dead_reason, retryable=True)
        if not eng.ready:
            return _error(503, "not_ready", "engine starting", retryable=True)
        return {"status": "ready", "phase": ws.phase.value}

    @app.post("/internal/generate")
    async def generate(req: GenerateRequest):
        if not ph.accepts(ws.state, req.role):
            return _error(
                409,
                WRONG_PHASE,
                f"node is {ws.state.value}; it does not take {req.role.value} requests",
                retryable=True,
            )
        try:
            eng.validate(req)
        except EngineError as exc:
            return _error(exc.status, exc.kind, str(exc), exc.retryable)
        agen = eng.generate(req)
        if not req.stream:
            return await _collect(agen, req)
        # Pull the first chunk before answering so engine errors become a
        # proper status instead of a broken stream.
        try:
            first = await agen.__anext__()
        except EngineError as exc:
            return _error(exc.status, exc.kind, str(exc), exc.retryable)
        return StreamingResponse(_ndjson(first, agen), media_type="application/x-ndjson")

    @app.post("/internal/abort", response_model=AbortResponse)
    async def abort(req: AbortRequest):
        return AbortResponse(request_id=req.request_id, aborted=await eng.abort(req.request_id))

    def _stale(exc: StaleTerm) -> JSONResponse:
        return _error(409, "stale_term", str(exc))

    @app.post("/internal/migrate", response_model=MigrateResponse)
    async def migrate(req: MigrateRequest):
        try:
            ws.fence.admit(req.term)
        except StaleTerm as exc:
            return _stale(exc)
        return MigrateResponse(migrated=await eng.migrate(req.request_ids))

    @app.post("/internal/fence", response_model=FenceStatus)
    async def fence(req: FenceRequest):
        ws.fence.observe(req.term)
        return _fence_status(ws, config.node_id)

    @app.get("/internal/phase", response_model=PhaseStatus)
    async def get_phase():
        p, d = eng.counts()
        return PhaseStatus(
            node_id=config.node_id, phase=ws.phase, draining_to=ws.draining_to, inflight_prefill=p, inflight_decode=d
        )

    @app.post("/internal/phase")
    async def set_phase(req: PhaseChangeRequest):
        try:
            ws.fence.admit(req.term)  # before anything else: a stale order changes nothing
        except StaleTerm as exc:
            return _stale(exc)
        if ws.switch_lock.locked():
            return _error(409, "switch_in_progress", "a phase change is already in progress", retryable=True)
        async with ws.switch_lock:
            try:
                return await change_phase(ws, config.node_id, req)
            except ph.InvalidTransition as exc:
                return _error(409, "invalid_transition", str(exc))

    @app.get("/internal/stats", response_model=WorkerStats)
    async def stats(since: int = 0):
        saved, dropped = eng.kv_events.drain() if eng.kv_events else ([], [])

        def loc(h: str, s: int) -> BlockLocation:
            return BlockLocation(block_hash=h, node_id=config.node_id, slot=s)

        running, waiting, kv_usage = eng.iterations.scheduler
        return WorkerStats(
            node_id=config.node_id,
            phase=ws.phase,
            draining_to=ws.draining_to,
            num_running=running,
            num_waiting=waiting,
            kv_usage=kv_usage,
            block_size=config.block_size,
            max_model_len=eng.max_model_len,
            tokens_per_s=eng.iterations.tokens_per_s(),
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            kv_capacity_tokens=eng.kv_capacity_tokens,
            host_store=_store_stats(ws, config),
            iterations=eng.iterations.since(max(0, since)),
            saved_blocks=[loc(h, s) for h, s in saved],
            dropped_blocks=[loc(h, s) for h, s in dropped],
            kv_peers=eng.kv_events.peer_stats() if eng.kv_events else [],
            fence_term=ws.fence.newest,
            refused_orders=ws.fence.refused,
            engine=healer.state(),
            engine_error=eng.dead_reason,
            started_at=started_at,
            engine_restarts=eng.restarts,
        )

    @app.get("/internal/requests", response_model=list[RequestTimingWire])
    async def request_timings(since: int = 0):
        """Engine-side first-token latency of recent requests (index >= since)."""
        return eng.request_timings.since(max(0, since))

    @app.get("/internal/kv/agent", response_model=KVAgentInfo)
    async def kv_agent():
        info = AgentInfo.read(pathlib.Path(config.run_dir) / config.node_id)
        if info is None:
            return _error(404, "not_found", "this worker has no KV pool agent")
        return KVAgentInfo(**dataclasses.asdict(info))

    return app


def _fence_status(ws: WorkerState, node_id: str) -> FenceStatus:
    f = ws.fence
    return FenceStatus(node_id=node_id, term=f.newest, accepted_orders=f.accepted, refused_orders=f.refused)


def _store_stats(ws: WorkerState, config: EngineConfig) -> HostStoreStats:
    """The host store's layout, read once from the connector's agent file
    (the heartbeat asks every half second; the layout never changes)."""
    if ws.store_stats is None:
        info = AgentInfo.read(pathlib.Path(config.run_dir) / config.node_id)
        if info is None:
            return HostStoreStats()  # not written yet (engine starting) or no pool
        ws.store_stats = HostStoreStats(capacity_blocks=info.capacity_blocks, block_bytes=info.block_bytes)
    return ws.store_stats


async def _ndjson(first: GenerateChunk, agen):
    yield first.model_dump_json(exclude_none=True) + "\n"
    try:
        async for chunk in agen:
            yield chunk.model_dump_json(exclude_none=True) + "\n"
    except EngineError as exc:
        yield (
            GenerateChunk(
                request_id=first.request_id, finish_reason=FinishReason.ERROR, error=str(exc), error_type=exc.kind
            ).model_dump_json(exclude_none=True)
            + "\n"
        )


async def _collect(agen, req: GenerateRequest):
    out = GenerateChunk(request_id=req.request_id)
    try:
        async for chunk in agen:
            out.token_ids += chunk.token_ids
            out.text += chunk.text
            if chunk.logprobs is not None:
                out.logprobs = (out.logprobs or []) + chunk.logprobs
            for f in (
                "finish_reason",
                "prompt_tokens",
                "cached_tokens",
                "external_cached_tokens",
                "saved_blocks",
            ):
                if getattr(chunk, f):
                    setattr(out, f, getattr(chunk, f))
    except EngineError as exc:
        return _error(exc.status, exc.kind, str(exc), exc.retryable)
    return JSONResponse(out.model_dump(exclude_none=True))
