"""The control plane the gateway serves with: store, event sink, tenant gate,
admin API, persisted operator overrides.

    cp = ControlPlane.build(settings)          # blocking: migrates, bootstraps
    app = create_app(settings, tenant_gate=cp.gate, admin_router=cp.admin_router,
                     switch_sinks=[cp.sink.record_switch], on_startup=[cp.start],
                     on_shutdown=[cp.stop], ...)

`build` runs at process start, before the event loop serves: it migrates the
store (`db upgrade`), makes sure an operator can log in (the first admin
token, or `EVOLVING_ADMIN_TOKEN`), and reads the persisted overrides. `start`
runs in the app's lifespan once the workers are registered: it starts the
buffered sink and the gate's refresh loop and restores the overrides (planner
mode, split pin, node pins) into the cluster runtime, realising the pins.
`stop` flushes what the sink holds.

With `settings.auth == "open"` the gate is `OpenTenantGate` (one tenant, no
keys, no limits); the store, admin API and event history work as usual.
"""

from __future__ import annotations

import logging
import os
import pathlib
from dataclasses import dataclass

from fastapi import APIRouter

from gateway.admin import bootstrap_admin_token, build_admin_router
from gateway.admin.auth import AdminAuthenticator
from gateway.control import ClusterControl, ClusterHistory
from gateway.errors import GatewayError
from gateway.policy import GateConfig, StoreTenantGate
from gateway.settings import GatewaySettings
from gateway.store import Database, EventSink, Overrides, SinkConfig, repository
from gateway.tenancy import OpenTenantGate, TenantGate
from planner.types import PlannerMode

log = logging.getLogger(__name__)

DEMO_TENANT = "demo"
DEMO_KEY_FILE = "demo-api-key"


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
    def build(cls, settings: GatewaySettings, *, sink_config: SinkConfig | None = None,
              gate_config: GateConfig | None = None) -> "ControlPlane":
        """Open and migrate the store, bootstrap the admin token, read overrides (blocking)."""
        from gateway.dbcli import db_upgrade

        url = settings.store_url
        if url.startswith("sqlite:///"):
            pathlib.Path(url[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
        db_upgrade(url)
        db = Database(url, pepper=settings.secret_pepper)
        first = bootstrap_admin_token(db, settings.admin_token)
        overrides = db.run(lambda s: repository.get_overrides(s))
        sink = EventSink(db, config=sink_config)
        gate: TenantGate = (StoreTenantGate(db, sink, config=gate_config) if settings.auth == "keys"
                            else OpenTenantGate())
        return cls(settings, db, sink, gate, AdminAuthenticator(db), overrides, first)

    def admin_router(self, control: ClusterControl, history: ClusterHistory) -> APIRouter:
        """`create_app`'s admin router factory; `control` is the cluster runtime (both ports)."""
        return build_admin_router(control=control, db=self.db, sink=self.sink, auth=self.auth)  # type: ignore[arg-type]

    @property
    def planner_mode(self) -> str:
        """The mode to start in: the operator's persisted choice wins over the setting."""
        return self.overrides.planner_mode or self.settings.planner_mode

    async def start(self, runtime) -> None:  # runtime: gateway.app.GatewayRuntime
        self.sink.start()
        if isinstance(self.gate, StoreTenantGate):
            await self.gate.start()
        await self.restore(runtime.cluster)

    async def restore(self, cluster) -> None:  # cluster: gateway.cluster.ClusterRuntime
        """Apply the persisted mode and pins; pins win, so realise them now."""
        cluster.mode = PlannerMode(self.planner_mode)
        known = {n.node_id for n in cluster.registry.nodes()}
        cluster.split_pin = self.overrides.split_pin
        cluster.node_pins = {n: p for n, p in self.overrides.node_pins.items() if n in known}
        for node in sorted(set(self.overrides.node_pins) - known):
            log.warning("persisted pin for unknown node %s ignored (not among the workers)", node)
        if cluster.split_pin is None and not cluster.node_pins:
            return
        log.info("restoring pins: split=%s nodes=%s", cluster.split_pin, cluster.node_pins)
        try:
            await cluster.enforce_pins(who="restore")
        except GatewayError as exc:  # an unhealthy node at startup: the pin stays, realised by the next pin action
            log.warning("could not realise the persisted pins yet: %s", exc.message)

    async def stop(self) -> None:
        if isinstance(self.gate, StoreTenantGate):
            await self.gate.stop()
        await self.sink.stop()
        self.db.dispose()

    def demo_api_key(self, data_dir: str | pathlib.Path) -> str | None:
        """The demo tenant's API key for `up`'s snippet (None with auth=open).

        The first call creates tenant "demo" with one key and writes its secret
        to `<data_dir>/demo-api-key` (mode 600); later calls read the file. If
        the file was deleted, a new key is made for the existing tenant.
        """
        if self.settings.auth != "keys":
            return None
        path = pathlib.Path(data_dir) / DEMO_KEY_FILE
        if path.exists():
            return path.read_text().strip()

        def create(session) -> str:
            tenant = repository.get_tenant(session, tenant_id=DEMO_TENANT)
            if tenant is None:
                tenant = repository.create_tenant(session, name=DEMO_TENANT, tenant_id=DEMO_TENANT)
                repository.add_audit(session, actor="system", action="tenant.create", target=f"tenant:{tenant.id}",
                                     after={"name": tenant.name})
            key, secret = repository.create_api_key(session, tenant_id=tenant.id, name="demo",
                                                    pepper=self.db.pepper)
            repository.add_audit(session, actor="system", action="api_key.create", target=f"api_key:{key.id}",
                                 after={"tenant_id": tenant.id, "name": key.name, "prefix": key.prefix})
            return secret

        secret = self.db.run(create)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secret + "\n")
        os.chmod(path, 0o600)  # in case the file existed with wider permissions
        return secret


def admin_token_notice(cp: ControlPlane) -> str:
    """What `up`/`gateway` print about the admin token: the secret only on the
    start that created it; afterwards, how to get one."""
    if cp.first_admin_token is not None:
        return ("admin token (operator; shown only this once, store it now):\n"
                f"  {cp.first_admin_token}\n"
                "  use it as `Authorization: Bearer <token>` on /admin and in the console")
    if cp.settings.admin_token is not None:
        return "admin token: the one in EVOLVING_ADMIN_TOKEN"
    return ("admin token: use the token printed at first start, or set EVOLVING_ADMIN_TOKEN to a new "
            "secret of 16+ characters\n  and restart: it is added as an operator token "
            "(e.g. EVOLVING_ADMIN_TOKEN=$(python -c 'import secrets; print(secrets.token_urlsafe(32))'))")


__all__ = ["ControlPlane", "DEMO_KEY_FILE", "DEMO_TENANT", "admin_token_notice"]
