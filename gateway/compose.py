"""The composition root: the product built from its settings, in one place.

    app = compose_app(settings)      # what `evolving-infra up` / `gateway` serve

`ControlPlane.build(settings)` runs at process start, before the event loop
serves (blocking): it migrates the store (`db upgrade`), makes sure an
operator can log in (the first admin token, or `EVOLVING_ADMIN_TOKEN`), and
reads the persisted overrides. `compose_app` then wires the control plane
(store-backed tenant gate, admin API, buffered event sink, the overrides
bus, planner leadership), the planner and its loop (`build_planner`) and the
gateway app (`gateway.app.create_app`).

What several gateway processes (replicas on Kubernetes, or `gateway
--workers N` on one host) share, when `EVOLVING_DIRECTORY_URL` names a Redis
server (`Shared`): the KV directory, tenant limits (`ClusterLimits`), the
workload stream the planner reads (`RedisWorkloadFeed`), the overrides bus
(`RedisBus`) and the replica membership. Leadership goes through the store
(`LeaderElector`), with or without Redis. Without Redis everything lives in
this process (`LocalWorkloadFeed`, `LocalBus`, limits per process): one
gateway process.

In the app's lifespan, `ControlPlane.start` starts the bus, the membership
heartbeat, the workload stream, the sink, the gate's refresh loop and the
limits' lease renewal, restores the overrides (planner mode, split pin, node
pins) through the `OverridesService`, starts the reconciliation loop, then
the elector (the leader realises the pins and decides at once); `stop`
releases the lease first (a follower takes over at once) and flushes what
the sink holds.

With `settings.auth == "open"` the gate is `OpenTenantGate` (one tenant, no
keys, no limits); the store, admin API and event history work as usual.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import pathlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter

from gateway.admin import bootstrap_admin_token, build_admin_router
from gateway.admin._deps import AdminControl
from gateway.admin.auth import AdminAuthenticator
from gateway.control.bus import AdminTokenRevoked, ClusterEvent, LocalBus, RedisBus
from gateway.control.leader_view import StoredDecision
from gateway.control.leadership import LeaderElector
from gateway.control.lease import LeaseConfig
from gateway.control.membership import Membership
from gateway.control.overrides import OverridesService
from gateway.control.planner_loop import PlannerLoop
from gateway.control.runtime import ClusterRuntime
from gateway.control.workload_feed import LocalWorkloadFeed, WorkloadFeed
from gateway.control.workload_stream import RedisWorkloadFeed
from gateway.kv.circuit import CircuitBreaker
from gateway.kv.directory import GatewayDirectory
from gateway.serving.policy import GateConfig, StoreTenantGate
from gateway.serving.policy.cluster_limits import ClusterLimits
from gateway.serving.policy.tenancy import OpenTenantGate, TenantGate
from gateway.serving.turn.requestlog import RequestLog
from gateway.settings import GatewaySettings
from gateway.store import Database, EventSink, Overrides, SinkConfig, repository
from gateway.store.db import StoreUnavailable
from planner.types import Planner

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    import redis.asyncio as aioredis
    from fastapi import FastAPI

    from gateway.app import GatewayRuntime


@dataclass
class Shared:
    """The Redis-backed state several gateway processes share (module docstring)."""

    client: aioredis.Redis
    base: str  # key prefix, `settings.redis_base`
    replica: str
    breaker: CircuitBreaker
    membership: Membership
    limits: ClusterLimits

    @classmethod
    def build(cls, settings: GatewaySettings) -> Shared:
        import redis.asyncio as aioredis

        assert settings.directory_url is not None
        client = aioredis.Redis.from_url(
            settings.directory_url,
            decode_responses=True,
            socket_timeout=1.0,
            socket_connect_timeout=1.0,
            health_check_interval=10,
        )
        base, replica = settings.redis_base, settings.replica
        breaker = CircuitBreaker()
        membership = Membership(client, base, replica, expected=settings.gateway_replicas)
        limits = ClusterLimits(client, base, replica, breaker=breaker, replicas=membership.count)
        return cls(client, base, replica, breaker, membership, limits)

    def directory(self, settings: GatewaySettings) -> GatewayDirectory:
        from kvpool.directory import create_directory

        return GatewayDirectory(
            create_directory("redis", client=self.client, prefix=self.base + ":kv"),
            block_size=settings.block_size,
            branch_ttl_s=settings.branch_ttl_s,
            breaker=self.breaker,
            replicas=self.membership.count,
        )


@dataclass
class ControlPlane:
    settings: GatewaySettings
    db: Database
    sink: EventSink
    gate: TenantGate
    auth: AdminAuthenticator
    overrides: Overrides
    # The bootstrap operator token when this start created it (print it once), else None.
    first_admin_token: str | None = None
    shared: Shared | None = None  # None: one gateway process, nothing in Redis
    bus: LocalBus | RedisBus = field(default_factory=LocalBus)
    elector: LeaderElector | None = None
    workload: WorkloadFeed = field(default_factory=LocalWorkloadFeed)
    service: OverridesService | None = None  # built with the admin router
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @classmethod
    def build(
        cls, settings: GatewaySettings, *, sink_config: SinkConfig | None = None, gate_config: GateConfig | None = None
    ) -> ControlPlane:
        """Open and migrate the store, bootstrap the admin token, read overrides (blocking)."""
        from gateway.store.migrate import db_upgrade

        url = settings.store_url
        if url.startswith("sqlite:///"):
            pathlib.Path(url[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
        db_upgrade(url)
        db = Database(url, pepper=settings.secret_pepper)
        first = bootstrap_admin_token(db, settings.admin_token)
        overrides = db.run(lambda s: repository.get_overrides(s))
        sink = EventSink(db, config=sink_config)
        shared = Shared.build(settings) if settings.directory_url else None
        gate: TenantGate = (
            StoreTenantGate(
                db,
                sink,
                config=gate_config or GateConfig(refresh_interval_s=settings.reconcile_s),
                cluster=shared.limits if shared is not None else None,
            )
            if settings.auth == "keys"
            else OpenTenantGate()
        )
        cp = cls(settings, db, sink, gate, AdminAuthenticator(db), overrides, first, shared)
        cp.wire()
        return cp

    def wire(self) -> None:
        """The parts that depend on what this process shares (also for planted control planes)."""
        replica = self.settings.replica
        if self.shared is not None:
            self.bus = RedisBus(self.shared.client, self.shared.base, replica)
            self.workload = RedisWorkloadFeed(
                self.shared.client, self.shared.base, replica, gap_ttl_s=self.settings.branch_ttl_s
            )
        else:
            self.bus = LocalBus(replica)
        self.elector = LeaderElector(
            self.db, replica, LeaseConfig(ttl_s=self.settings.leader_ttl_s, renew_s=self.settings.leader_renew_s)
        )
        if isinstance(self.gate, StoreTenantGate):
            self.bus.subscribe(self.gate.on_event, on_resync=self.gate.refresh)
        self.bus.subscribe(self._on_admin_event)

    async def _on_admin_event(self, event: ClusterEvent) -> None:
        revoked = event.payload()
        if isinstance(revoked, AdminTokenRevoked):
            self.auth.forget(revoked.token_id)

    def admin_router(self, control: AdminControl, requests: RequestLog | None = None) -> APIRouter:
        """`create_app`'s admin router factory; `control` is the cluster runtime,
        `requests` the serving side's request log."""
        self.service = OverridesService(control, self.sink, bus=self.bus)
        self.bus.subscribe(self.service.on_event, on_resync=self.reconcile)
        return build_admin_router(
            control=control,
            db=self.db,
            sink=self.sink,
            auth=self.auth,
            overrides=self.service,
            bus=self.bus,
            requests=requests,
        )

    @property
    def planner_mode(self) -> str:
        """The mode to start in: the operator's persisted choice wins over the setting."""
        return self.overrides.planner_mode or self.settings.planner_mode

    async def start(self, runtime: GatewayRuntime) -> None:
        await self.bus.start()
        if self.shared is not None:
            await self.shared.membership.start()
            await self.shared.limits.start()
        if isinstance(self.workload, RedisWorkloadFeed):
            await self.workload.start()
        self.sink.start()
        if isinstance(self.gate, StoreTenantGate):
            await self.gate.start()
        await self.restore(runtime.cluster)
        await self.seed_predictions(runtime.cluster)
        self._tasks.append(asyncio.get_running_loop().create_task(self._reconcile_loop(), name="reconcile"))
        if self.elector is not None:
            self.elector.on_elected(runtime.cluster.on_elected)
            await self.elector.start()

    async def seed_predictions(self, cluster: ClusterRuntime) -> None:
        """Show the last stored prediction per split until the planner makes a
        new one (best effort: a store outage only leaves the page empty)."""
        try:
            latest = await self.db.run_async(repository.latest_predictions)
        except StoreUnavailable:
            log.warning("store unreachable; the planner's last predictions are not shown until it makes new ones")
            return
        if latest is not None:
            cluster.seed_predictions(latest[1], latest[0])

    async def restore(self, cluster: ClusterRuntime) -> None:
        """Apply the persisted mode and pins; the leader realises the pins."""
        service = self.service or OverridesService(cluster, self.sink, bus=self.bus)
        await service.restore(self.overrides, default_mode=self.settings.planner_mode)

    async def reconcile(self) -> None:
        """Apply overrides changed through other replicas whose notice this one missed."""
        if self.service is None:
            return
        try:
            stored = await self.db.run_async(lambda s: repository.get_overrides(s))
        except StoreUnavailable:
            return
        await self.service.reconcile(stored)

    async def _reconcile_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.reconcile_s)
            try:
                await self.reconcile()
            except Exception:  # the loop must outlive one bad round
                log.exception("overrides reconciliation failed")

    async def stop(self) -> None:
        if self.elector is not None:
            await self.elector.stop()  # release the lease first: a follower takes over at once
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if isinstance(self.gate, StoreTenantGate):
            await self.gate.stop()
        if isinstance(self.workload, RedisWorkloadFeed):
            await self.workload.stop()
        await self.bus.stop()
        if self.shared is not None:
            await self.shared.limits.stop()
            await self.shared.membership.stop()
        await self.sink.stop()
        if self.shared is not None:
            await self.shared.client.aclose()
        self.db.dispose()


def admin_token_notice(cp: ControlPlane) -> str:
    """What `up`/`gateway` print about the admin token: the secret only on the
    start that created it; afterwards, how to get one."""
    if cp.first_admin_token is not None:
        return (
            "admin token (operator; shown only this once, store it now):\n"
            f"  {cp.first_admin_token}\n"
            "  use it as `Authorization: Bearer <token>` on /admin and in the console"
        )
    if cp.settings.admin_token is not None:
        return "admin token: the one in EVOLVING_ADMIN_TOKEN"
    return (
        "admin token: use the token printed at first start, or set EVOLVING_ADMIN_TOKEN to a new "
        "secret of 16+ characters\n  and restart: it is added as an operator token "
        "(e.g. EVOLVING_ADMIN_TOKEN=$(python -c 'import secrets; print(secrets.token_urlsafe(32))'))"
    )


def build_planner(settings: GatewaySettings) -> Planner | None:
    """The planner named by `settings.planner` (None for "none").

    The evolving planner is told what this gateway does: the router's
    local-prefill threshold (which requests run whole on a decode node: the
    workload's local/remote classes must be the router's), and that it may
    go down to `planner_min_prefill` prefill nodes — the router serves with
    none (decode nodes compute every prompt), so on a two-node cluster 0P/2D
    is the only other split there is. The workers' engine limits reach it
    per tick (`PlannerLoop.view`).
    """
    from planner.evolving import EvolvingConfig
    from planner.registry import make_planner

    if settings.planner == "none":
        return None
    if settings.planner == "static":  # holds the split `up` starts with
        return make_planner("static", prefill_nodes=len(settings.worker_urls) // 2)
    if settings.planner == "evolving":
        workload = dataclasses.replace(
            EvolvingConfig().workload, local_prefill_max_tokens=settings.local_prefill_max_tokens
        )
        return make_planner("evolving", min_prefill=settings.planner_min_prefill, workload=workload)
    return make_planner(settings.planner)


def compose_app(
    settings: GatewaySettings,
    *,
    control_plane: ControlPlane | None = None,
    planner: Planner | None | str = "settings",
    **create_app_kwargs: Any,
) -> FastAPI:
    """The app `up`/`gateway` serve: control plane + planner loop + gateway.

    `control_plane` defaults to `ControlPlane.build(settings)` (blocking:
    migrates the store); `planner` to `build_planner(settings)`. Extra
    keywords go to `create_app` (tests pass a tokenizer or worker client).
    The control plane is on `app.state.control_plane`, the loop on
    `app.state.planner_loop`.
    """
    from gateway.app import create_app

    cp = control_plane or ControlPlane.build(settings)
    if cp.elector is None:
        cp.wire()
    chosen = build_planner(settings) if isinstance(planner, str) else planner
    loop = PlannerLoop(chosen, workload=cp.workload, sink=cp.sink.record_decision) if chosen is not None else None
    if cp.shared is not None:
        create_app_kwargs.setdefault("directory", cp.shared.directory(settings))
    app = create_app(
        settings,
        tenant_gate=cp.gate,
        admin_router=cp.admin_router,
        switch_sinks=[cp.sink.record_switch],
        planner_tick=loop.tick if loop else None,
        planner_name=loop.planner.name if loop else "none",
        workload=cp.workload,
        leadership=cp.elector,
        leader_decision=StoredDecision(cp.db).latest,
        planner_interval_s=settings.planner_interval_s,
        on_startup=[cp.start],
        on_shutdown=[cp.stop],
        **create_app_kwargs,
    )
    app.state.control_plane = cp
    app.state.planner_loop = loop
    return app


def app_from_env() -> FastAPI:
    """The app of one process of `evolving-infra gateway --workers N` (uvicorn's
    factory): settings from the environment, which the parent filled in."""
    return compose_app(GatewaySettings.from_env())
