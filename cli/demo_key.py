"""The demo tenant `up` prints a ready-to-run snippet for, and its key.

`demo_key(cp, data_dir)` gives the key the snippet and the built-in load
use, checked against the store: a key file left over after an operator
revoked the key or deleted the tenant gives a `DemoKey` with `problem` set
and a hint how to get a working key, never a snippet that answers 401.
"""

from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass

from gateway.compose import ControlPlane
from gateway.store import credentials, repository

DEMO_TENANT = "demo"
DEMO_KEY_FILE = "demo-api-key"


@dataclass(frozen=True)
class DemoKey:
    secret: str | None  # None: no usable key (see problem), or auth=open
    path: pathlib.Path
    tenant: str | None = None  # the tenant the key belongs to
    problem: str | None = None  # why there is no usable key, and what to do


def key_tenant(cp: ControlPlane, secret: str) -> str | None:
    """The name of the tenant whose active key `secret` is, or None."""

    def lookup(session) -> str | None:
        for grant in repository.load_key_grants(session, prefix=credentials.visible_prefix(secret)):
            if credentials.verify_secret(secret, salt=grant.salt, pepper=cp.db.pepper, secret_hash=grant.secret_hash):
                return grant.tenant_name
        return None

    return cp.db.run(lookup)


def demo_key(cp: ControlPlane, data_dir: str | pathlib.Path) -> DemoKey:
    """The demo key: minted on first use, then read from its file and checked."""
    path = pathlib.Path(data_dir) / DEMO_KEY_FILE
    if cp.settings.auth != "keys":
        return DemoKey(None, path)
    if not path.exists():
        secret = mint_demo_key(cp, path)
        return DemoKey(secret, path, DEMO_TENANT)
    secret = path.read_text().strip()
    tenant = key_tenant(cp, secret) if secret else None
    if tenant is None:
        return DemoKey(
            None,
            path,
            problem=(
                f"the key in {path} is not valid in this store (revoked, or its tenant was deleted). "
                f"To get a new demo key, delete {path} and start again; or create a key on the console's "
                "Tenants page (or POST /admin/tenants/<id>/keys) and use that"
            ),
        )
    return DemoKey(secret, path, tenant)


def mint_demo_key(cp: ControlPlane, path: pathlib.Path) -> str:
    """Create tenant "demo" (if missing) and one key; write its secret to
    `path` (mode 600). Both writes are audited as actor `system`."""

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
