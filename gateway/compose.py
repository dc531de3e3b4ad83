"""The composition root: the product built from its settings, in one place.

    app = compose_app(settings)      # what `evolving-infra up` / `gateway` serve

`ControlPlane.build(settings)` runs at process start, before the event loop
serves (blocking): it migrates the store (`db upgrade`), makes sure an
operator can log in (the first admin token, or `EVOLVING_ADMIN_TOKEN`), and
reads the persisted overrides. `compose_app` then wires the control plane
(store-backed tenant gate, admin API, buffered event sink), the planner and
its loop (`build_planner`, fed by a `LocalWorkloadFeed` the OpenAI service
adds to) and the gateway app (`gateway.app.create_app`). In the app's
lifespan, `ControlPlane.start` starts the sink and the gate's refresh loop
and restores the overrides (planner mode, split pin, node pins) through the
`OverridesService`, realising the pins; `stop` flushes what the sink holds.

With `settings.auth == "open"` the gate is `OpenTenantGate` (one tenant, no
keys, no limits); the store, admin API and event history work as usual.
"""

from __future__ import annotations

import dataclasses
import logging
import pathlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter

from gateway.admin import bootstrap_admin_token, build_admin_router
from gateway.admin._deps import AdminControl
from gateway.admin.auth import AdminAuthenticator
from gateway.control.overrides import OverridesService
from gateway.control.planner_loop import PlannerLoop
from gateway.control.runtime import ClusterRuntime
from gateway.control.workload_feed import LocalWorkloadFeed
from gateway.serving.policy import GateConfig, StoreTenantGate
from gateway.serving.tenancy import OpenTenantGate, TenantGate
from gateway.settings import GatewaySettings
from gateway.store import Database, EventSink, Overrides, SinkConfig, repository
from gateway.store.db import StoreUnavailable
from planner.types import Planner

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from fastapi import FastAPI

    from gateway.app import GatewayRuntime


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
        gate: TenantGate = (
            StoreTenantGate(db, sink, config=gate_config) if settings.auth == "keys" else OpenTenantGate()
        )
        return cls(settings, db, sink, gate, AdminAuthenticator(db), overrides, first)

    def admin_router(self, control: AdminControl) -> APIRouter:
        """`create_app`'s admin router factory; `control` is the cluster runtime."""
        return build_admin_router(control=control, db=self.db, sink=self.sink, auth=self.auth)

    @property
    def planner_mode(self) -> str:
        """The mode to start in: the operator's persisted choice wins over the setting."""
        return self.overrides.planner_mode or self.settings.planner_mode

    async def start(self, runtime: GatewayRuntime) -> None:
        self.sink.start()
        if isinstance(self.gate, StoreTenantGate):
            await self.gate.start()
        await self.restore(runtime.cluster)
        await self.seed_predictions(runtime.cluster)

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
        """Apply the persisted mode and pins; pins win, so realise them now."""
        await OverridesService(cluster, self.sink).restore(self.overrides, default_mode=self.settings.planner_mode)

    async def stop(self) -> None:
        if isinstance(self.gate, StoreTenantGate):
            await self.gate.stop()
        await self.sink.stop()
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
    chosen = build_planner(settings) if planner == "settings" else planner
    workload = LocalWorkloadFeed()
    loop = PlannerLoop(chosen, workload=workload, sink=cp.sink.record_decision) if chosen is not None else None
    app = create_app(
        settings,
        tenant_gate=cp.gate,
        admin_router=cp.admin_router,
        switch_sinks=[cp.sink.record_switch],
        planner_tick=loop.tick if loop else None,
        planner_name=loop.planner.name if loop else "none",
        workload=workload,
        planner_interval_s=settings.planner_interval_s,
        on_startup=[cp.start],
        on_shutdown=[cp.stop],
        **create_app_kwargs,
    )
    app.state.control_plane = cp
    app.state.planner_loop = loop
    return app
