"""The gateway application factory.

`create_app(settings, ...)` wires the parts; every collaborator can be
injected (tests pass fakes), the rest is built from `settings`:

    tokenizer      PromptTokenizer.from_dir(settings.model_dir)
    worker_client  RawWorkerClient (pooled keep-alive connections; control calls over httpx)
    directory      GatewayDirectory over kvpool's memory directory (Redis with
                   settings.directory_url)
    tenant_gate    OpenTenantGate (no auth); the control plane passes its gate
    admin_router   factory (the cluster runtime, the request log) -> APIRouter, mounted as is
    switch_sinks   extra switch recorders (event store); metrics are always one
    planner_tick   coroutine run every `planner_interval_s` (see gateway.control.runtime),
                   reported as `planner_name`
    workload       where finished-request samples go for the planner (LocalWorkloadFeed)
    leadership     which replica's planner acts (`gateway.control.leadership.LeaderElector`);
                   None: this gateway always leads. Its term goes on every order
                   and heartbeat fence; a worker's stale-term refusal deposes it.
    leader_decision  coroutine function returning the leader's latest decision (what a
                   follower's admin API shows)
    output_parsing vLLM's tool-call / reasoning parser (OutputParsing.create from the
                   settings; importing vLLM costs this process 9-15 s and ~550 MiB once)
    response_store stored Responses API turns (memory; Redis with settings.directory_url)
    on_startup     async hooks(runtime) run at startup (the control plane's start)
    on_shutdown    async hooks() run at shutdown, in reverse order
    tracing        OpenTelemetry spans (`gateway.telemetry.Tracing`; built from
                   settings.tracing: off without an OTLP endpoint, and then no
                   middleware is installed at all)

The app is a `GatewayApp` (gateway.http.asgi): POST /v1/chat/completions and
/v1/completions skip FastAPI's routing layers; /admin bodies are limited to
`settings.admin_max_body_bytes`. Metric labels are bounded: a request that
matched no route is counted under the endpoint "other".

Nothing touches the network before startup: the lifespan registers the
workers, starts the heartbeat, cluster/planner and branch-expiry loops, and
stops them (and closes the pool) on shutdown. The live objects are on
`app.state.runtime` (`GatewayRuntime`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute

from gateway.control.health import NodeHealth
from gateway.control.phase_switch import PhaseSwitcher, SwitchSink
from gateway.control.ports import Leadership
from gateway.control.registry import WorkerRegistry
from gateway.control.runtime import ClusterRuntime, DecisionSource, PlannerTick
from gateway.control.workload_feed import WorkloadFeed
from gateway.http.asgi import BodySizeLimit, GatewayApp
from gateway.http.docs import install_openapi
from gateway.http.error_responses import install_error_handlers
from gateway.kv.directory import Directory, GatewayDirectory
from gateway.metrics import GatewayMetrics
from gateway.serving.anthropic.routes import anthropic_router
from gateway.serving.openai.routes import openai_router
from gateway.serving.orchestrator import Orchestrator, OrchestratorConfig
from gateway.serving.policy.tenancy import OpenTenantGate, TenantGate
from gateway.serving.responses.routes import responses_router
from gateway.serving.responses.store import MemoryResponseStore, RedisResponseStore, ResponseStore
from gateway.serving.tokenize import PromptTokenizer, model_sampling_defaults
from gateway.serving.tokenize_process import ProcessTokenizer
from gateway.serving.turn.parsing import OutputParsing
from gateway.serving.turn.requestlog import RequestLog
from gateway.serving.turn.service import TurnService
from gateway.settings import GatewaySettings
from gateway.telemetry import Tracing, TracingMiddleware, TurnOpener
from gateway.upstream.port import WorkerAPI
from gateway.upstream.raw_client import RawWorkerClient
from routing import RouterConfig

log = logging.getLogger(__name__)

AdminRouterFactory = Callable[[ClusterRuntime, RequestLog], APIRouter]


@dataclass
class GatewayRuntime:
    settings: GatewaySettings
    client: WorkerAPI
    directory: Directory
    registry: WorkerRegistry
    orchestrator: Orchestrator
    switcher: PhaseSwitcher
    cluster: ClusterRuntime
    metrics: GatewayMetrics
    service: TurnService


# Lifespan hooks: startup hooks run in order once the workers are registered
# (before the background loops start); shutdown hooks run in reverse order
# after the loops stop, before the worker pool closes.
StartupHook = Callable[[GatewayRuntime], Awaitable[None]]
ShutdownHook = Callable[[], Awaitable[None]]


def create_app(  # noqa: C901 - a route table: each handler is its own small function
    settings: GatewaySettings,
    *,
    tokenizer: PromptTokenizer | None = None,
    worker_client: WorkerAPI | None = None,
    directory: Directory | None = None,
    tenant_gate: TenantGate | None = None,
    admin_router: AdminRouterFactory | None = None,
    switch_sinks: list[SwitchSink] | None = None,
    planner_tick: PlannerTick | None = None,
    planner_name: str = "none",
    planner_interval_s: float = 1.0,
    workload: WorkloadFeed | None = None,
    leadership: Leadership | None = None,
    leader_decision: DecisionSource | None = None,
    output_parsing: OutputParsing | None = None,
    response_store: ResponseStore | None = None,
    on_startup: Sequence[StartupHook] = (),
    on_shutdown: Sequence[ShutdownHook] = (),
    tracing: Tracing | None = None,
) -> FastAPI:
    if tracing is None:
        tracing = Tracing.build(settings.tracing, replica=settings.replica)
    process_tokenizer = None
    if tokenizer is None:
        if not settings.model_dir:
            raise ValueError("settings.model_dir (or a tokenizer) is required")
        tokenizer = PromptTokenizer.from_dir(settings.model_dir)
        if settings.tokenize_process != "off":  # the same tokenizer, loaded in its own process
            process_tokenizer = ProcessTokenizer(settings.model_dir)
    client = worker_client or RawWorkerClient(
        cluster_token=settings.cluster_token,
        connect_timeout_s=settings.connect_timeout_s,
        read_timeout_s=settings.stream_idle_timeout_s,
        max_connections=settings.max_connections,
    )
    if directory is None:
        from kvpool.directory import create_directory

        backend = (
            create_directory("redis", url=settings.directory_url, prefix=settings.redis_base + ":kv")
            if settings.directory_url
            else create_directory("memory")
        )
        directory = GatewayDirectory(backend, block_size=settings.block_size, branch_ttl_s=settings.branch_ttl_s)
    metrics = GatewayMetrics()
    term = (lambda: leadership.order_term()) if leadership is not None else (lambda: None)
    registry = WorkerRegistry(client, directory, failures_to_unhealthy=settings.heartbeat_failures, term_source=term)
    orchestrator = Orchestrator(
        registry,
        client,
        directory,
        OrchestratorConfig(
            router=RouterConfig(local_prefill_max_tokens=settings.local_prefill_max_tokens),
            max_node_attempts=settings.max_node_attempts,
            resume_wait_s=settings.resume_wait_s,
        ),
    )
    switcher = PhaseSwitcher(
        registry,
        client,
        deadline_s=settings.switch_deadline_s,
        sinks=[metrics.observe_switch, *(switch_sinks or [])],
        term_source=term,
        on_fenced=(lambda why: leadership.deposed(why=why)) if leadership is not None else (lambda why: None),
        tracing=tracing,
    )
    cluster = ClusterRuntime(
        registry,
        switcher,
        directory,
        planner_tick=planner_tick,
        planner_name=planner_name,
        leadership=leadership,
        leader_decision=leader_decision,
        tracing=tracing,
    )
    if output_parsing is None:
        output_parsing = OutputParsing.create(
            tokenizer.hf,
            tool_parser=settings.tool_call_parser,
            reasoning_parser=settings.reasoning_parser,
            tool_strict_level=settings.tool_strict_level,
        )
    if response_store is None:
        response_store = (
            RedisResponseStore.from_url(
                settings.directory_url, ttl_s=settings.responses_ttl_s, prefix=settings.redis_base + ":responses"
            )
            if settings.directory_url
            else MemoryResponseStore(ttl_s=settings.responses_ttl_s, max_entries=settings.responses_max)
        )
    service = TurnService(
        model_name=settings.served_model,
        tokenizer=tokenizer,
        orchestrator=orchestrator,
        gate=tenant_gate or OpenTenantGate(),
        directory=directory,
        metrics=metrics,
        default_max_tokens=settings.default_max_tokens,
        workload=workload,
        max_prompt_tokens=settings.max_prompt_tokens,
        parsing=output_parsing,
        context_limit=registry.context_limit,
        model_aliases=dict.fromkeys(settings.model_aliases, settings.served_model),
        sampling_defaults=model_sampling_defaults(settings.model_dir) if settings.model_dir else None,
        process_tokenizer=process_tokenizer,
        process_chars=settings.tokenize_process_chars,
        request_log=RequestLog(settings.request_log_size),
    )
    runtime = GatewayRuntime(settings, client, directory, registry, orchestrator, switcher, cluster, metrics, service)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if process_tokenizer is not None and settings.tokenize_process == "warm":
            await process_tokenizer.warm()  # ready only once a big prompt can be tokenized at once
        await asyncio.gather(*(registry.add(url) for url in settings.worker_urls))
        for hook in on_startup:
            await hook(runtime)
        tasks = [
            asyncio.create_task(registry.run(settings.heartbeat_interval_s), name="heartbeat"),
            asyncio.create_task(cluster.run(planner_interval_s), name="cluster"),
            asyncio.create_task(_expire_branches(directory, settings.branch_ttl_s), name="branch-expiry"),
        ]
        try:
            yield
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            try:
                await directory.flush_stats()  # before the shared client closes (cp.stop)
                for stop in reversed(on_shutdown):
                    await stop()
            finally:
                if isinstance(response_store, RedisResponseStore):
                    await response_store.aclose()
                await client.aclose()
                service.close()
                tracing.shutdown()  # the spans still buffered go out

    app = GatewayApp(title="evolving-infra gateway", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.runtime = runtime
    app.state.tracing = tracing
    if tracing.enabled:
        app.tracer = TurnOpener(tracing)  # the hot routes: traced inline
        app.wrap_outer(lambda inner: TracingMiddleware(inner, tracing))

    def observe_error(request: Request, status: int) -> None:
        if request.url.path.startswith("/v1/"):
            metrics.observe_request("-", endpoint_label(request.scope.get("route")), status)

    install_error_handlers(app, on_error=observe_error)
    openai = openai_router(service, max_body_bytes=settings.max_body_bytes)
    app.include_router(openai)
    for route in openai.routes:
        if isinstance(route, APIRoute) and route.path in HOT_PATHS:
            app.add_hot_route(route)
    app.include_router(responses_router(service, response_store, max_body_bytes=settings.max_body_bytes))
    app.include_router(anthropic_router(service, max_body_bytes=settings.max_body_bytes))
    install_openapi(app)
    if admin_router is not None:
        app.include_router(admin_router(cluster, service.requests))
    app.add_middleware(BodySizeLimit, limit=settings.admin_max_body_bytes, prefix="/admin")

    @app.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
    async def root() -> dict[str, str]:
        """What is served here. Claude Code sends `HEAD /` before its requests (a reachability check)."""
        return {"service": "evolving-infra", "model": settings.served_model, "api": "/v1", "docs": "/docs"}

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        healthy = registry.healthy_count()
        # Workers whose process answers but whose engine core died do not count.
        dead = sum(1 for n in registry.nodes() if n.health is NodeHealth.ENGINE_DEAD)
        body = {"status": "ready" if healthy else "no healthy worker", "workers": healthy, "engines_dead": dead}
        return JSONResponse(body, status_code=200 if healthy else 503)

    @app.get("/metrics")
    async def prometheus() -> Response:
        metrics.refresh(registry, await directory.stats())
        metrics.refresh_planner(cluster.last_decision)
        data, content_type = metrics.render()
        return Response(data, media_type=content_type)

    return app


# The OpenAI routes served without FastAPI's routing layers (gateway.http.asgi).
HOT_PATHS = ("/v1/chat/completions", "/v1/completions")
# Route template -> `endpoint` label; other matched /v1 routes use their last literal segment.
_ENDPOINTS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/models": "models",
    "/v1/models/{model_id:path}": "models",
    "/v1/branches/{branch_id}/finish": "branch_finish",
}


def endpoint_label(route: object) -> str:
    """The `endpoint` label of a request that matched `route` ("other" for none): bounded by the routes."""
    path = getattr(route, "path", None)
    if not isinstance(path, str):
        return "other"
    known = _ENDPOINTS.get(path)
    if known is not None:
        return known
    literal = [p for p in path.split("/") if p and not p.startswith("{")]
    return literal[-1] if literal else "other"


async def _expire_branches(directory: Directory, ttl_s: float) -> None:
    while True:
        await asyncio.sleep(min(60.0, ttl_s / 4))
        expired = await directory.expire()
        if expired:
            log.info("expired %d idle branches", len(expired))
