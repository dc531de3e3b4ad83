"""The demo tenant `up` prints a ready-to-run snippet for."""

from __future__ import annotations

import os
import pathlib

from gateway.compose import ControlPlane
from gateway.store import repository

DEMO_TENANT = "demo"
DEMO_KEY_FILE = "demo-api-key"


def demo_api_key(cp: ControlPlane, data_dir: str | pathlib.Path) -> str | None:
    """The demo tenant's API key for `up`'s snippet (None with auth=open).

    The first call creates tenant "demo" with one key and writes its secret
    to `<data_dir>/demo-api-key` (mode 600); later calls read the file. If
    the file was deleted, a new key is made for the existing tenant.
    """
    if cp.settings.auth != "keys":
        return None
    path = pathlib.Path(data_dir) / DEMO_KEY_FILE
    if path.exists():
        return path.read_text().strip()

    def create(session) -> str:
        tenant = repository.get_tenant(session, tenant_id=DEMO_TENANT)
        if tenant is None:
            tenant = repository.create_tenant(session, name=DEMO_TENANT, tenant_id=DEMO_TENANT)
            repository.add_audit(
                session,
                actor="system",
                actor_id="system",
                action="tenant.create",
                target=f"tenant:{tenant.id}",
                after={"name": tenant.name},
            )
        key, secret = repository.create_api_key(session, tenant_id=tenant.id, name="demo", pepper=cp.db.pepper)
        repository.add_audit(
            session,
            actor="system",
            actor_id="system",
            action="api_key.create",
            target=f"api_key:{key.id}",
            after={"tenant_id": tenant.id, "name": key.name, "prefix": key.prefix},
        )
        return secret

    secret = cp.db.run(create)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    os.chmod(path, 0o600)  # in case the file existed with wider permissions
    return secret
