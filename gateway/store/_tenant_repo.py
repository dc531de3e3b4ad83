"""Repository functions for tenants, API keys, policies and admin tokens.

Keyword-only, take a session, never commit (the caller's `Database.session()`
owns the transaction).
"""

from __future__ import annotations

import secrets as _random
import time
from collections.abc import Sequence
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.orm import Session

from gateway.http import errors
from gateway.store import credentials
from gateway.store.records import KeyGrant, Policy
from gateway.store.tables import AdminToken, ApiKey, Tenant, TenantPolicy


def _now(now: float | None) -> float:
    return time.time() if now is None else now


def _page(session: Session, stmt: sa.Select, *, limit: int, offset: int) -> tuple[list, int]:
    total = session.scalar(sa.select(sa.func.count()).select_from(stmt.order_by(None).subquery())) or 0
    return list(session.scalars(stmt.limit(limit).offset(offset))), int(total)


# -- tenants -----------------------------------------------------------------


def create_tenant(
    session: Session, *, name: str, tenant_id: str | None = None, policy: Policy | None = None, now: float | None = None
) -> Tenant:
    """Create a tenant with its own cache salt and a policy (default: unlimited)."""
    if session.scalar(sa.select(Tenant.id).where(Tenant.name == name)) is not None:
        raise errors.Conflict(f"A tenant named {name!r} already exists.", param="name")
    if tenant_id is not None and session.get(Tenant, tenant_id) is not None:
        raise errors.Conflict(f"Tenant id {tenant_id!r} is taken.", param="id")
    t = _now(now)
    tenant = Tenant(
        id=tenant_id or credentials.new_id("ten"), name=name, cache_salt=_random.token_hex(16), created_at=t
    )
    session.add(tenant)
    session.flush()
    put_policy(session, tenant_id=tenant.id, policy=policy or Policy(), now=t)
    return tenant


def get_tenant(session: Session, *, tenant_id: str) -> Tenant | None:
    return session.get(Tenant, tenant_id)


def list_tenants(session: Session, *, limit: int = 100, offset: int = 0) -> tuple[list[Tenant], int]:
    return _page(session, sa.select(Tenant).order_by(Tenant.created_at, Tenant.id), limit=limit, offset=offset)


def rename_tenant(session: Session, *, tenant_id: str, name: str) -> Tenant | None:
    tenant = session.get(Tenant, tenant_id)
    if tenant is None:
        return None
    clash = session.scalar(sa.select(Tenant.id).where(Tenant.name == name, Tenant.id != tenant_id))
    if clash is not None:
        raise errors.Conflict(f"A tenant named {name!r} already exists.", param="name")
    tenant.name = name
    return tenant


def delete_tenant(session: Session, *, tenant_id: str) -> bool:
    """Delete a tenant with its keys and policy (usage rows are kept)."""
    session.execute(sa.delete(ApiKey).where(ApiKey.tenant_id == tenant_id))
    session.execute(sa.delete(TenantPolicy).where(TenantPolicy.tenant_id == tenant_id))
    result = session.execute(sa.delete(Tenant).where(Tenant.id == tenant_id))
    return cast("sa.CursorResult[Any]", result).rowcount > 0  # a DELETE's result is a CursorResult


# -- policies ----------------------------------------------------------------


def _policy_from_row(row: TenantPolicy | None) -> Policy:
    if row is None:
        return Policy()
    return Policy(
        requests_per_minute=row.requests_per_minute,
        tokens_per_minute=row.tokens_per_minute,
        max_concurrent=row.max_concurrent,
        priority=row.priority,
        allowed_models=None if row.allowed_models is None else tuple(row.allowed_models),
        max_active_branches=row.max_active_branches,
        kv_retention_blocks=row.kv_retention_blocks,
        cache_isolation=row.cache_isolation,
    )


def get_policy(session: Session, *, tenant_id: str) -> Policy:
    """The tenant's policy; the default (unlimited, isolated) if none is stored."""
    return _policy_from_row(session.get(TenantPolicy, tenant_id))


def put_policy(session: Session, *, tenant_id: str, policy: Policy, now: float | None = None) -> Policy:
    row = session.get(TenantPolicy, tenant_id) or TenantPolicy(tenant_id=tenant_id)
    row.requests_per_minute = policy.requests_per_minute
    row.tokens_per_minute = policy.tokens_per_minute
    row.max_concurrent = policy.max_concurrent
    row.priority = policy.priority
    row.allowed_models = None if policy.allowed_models is None else list(policy.allowed_models)
    row.max_active_branches = policy.max_active_branches
    row.kv_retention_blocks = policy.kv_retention_blocks
    row.cache_isolation = policy.cache_isolation
    row.updated_at = _now(now)
    session.add(row)
    session.flush()
    return policy


# -- API keys ----------------------------------------------------------------


def create_api_key(
    session: Session, *, tenant_id: str, name: str = "", pepper: str, now: float | None = None
) -> tuple[ApiKey, str]:
    """Create a key; returns the row and the secret (the only time it exists in clear)."""
    sealed = credentials.new_secret(credentials.TENANT_KEY_PREFIX, pepper=pepper)
    key = ApiKey(
        id=credentials.new_id("key"),
        tenant_id=tenant_id,
        name=name,
        prefix=sealed.prefix,
        salt=sealed.salt,
        secret_hash=sealed.secret_hash,
        created_at=_now(now),
    )
    session.add(key)
    session.flush()
    return key, sealed.secret


def list_api_keys(session: Session, *, tenant_id: str, limit: int = 100, offset: int = 0) -> tuple[list[ApiKey], int]:
    stmt = sa.select(ApiKey).where(ApiKey.tenant_id == tenant_id).order_by(ApiKey.created_at, ApiKey.id)
    return _page(session, stmt, limit=limit, offset=offset)


def revoke_api_key(session: Session, *, tenant_id: str, key_id: str, now: float | None = None) -> ApiKey | None:
    key = session.get(ApiKey, key_id)
    if key is None or key.tenant_id != tenant_id:
        return None
    if key.revoked_at is None:
        key.revoked_at = _now(now)
    return key


def load_key_grants(session: Session, *, prefix: str | None = None) -> list[KeyGrant]:
    """Every active key (or those with `prefix`) with its tenant and policy."""
    stmt = (
        sa.select(ApiKey, Tenant, TenantPolicy)
        .join(Tenant, Tenant.id == ApiKey.tenant_id)
        .outerjoin(TenantPolicy, TenantPolicy.tenant_id == Tenant.id)
        .where(ApiKey.revoked_at.is_(None))
    )
    if prefix is not None:
        stmt = stmt.where(ApiKey.prefix == prefix)
    return [
        KeyGrant(
            key_id=k.id,
            prefix=k.prefix,
            salt=k.salt,
            secret_hash=k.secret_hash,
            tenant_id=t.id,
            tenant_name=t.name,
            cache_salt=t.cache_salt,
            policy=_policy_from_row(p),
        )
        for k, t, p in session.execute(stmt)
    ]


# -- admin tokens ------------------------------------------------------------


def create_admin_token(
    session: Session, *, name: str, role: str, pepper: str, secret: str | None = None, now: float | None = None
) -> tuple[AdminToken, str]:
    """Create an admin token (random, or `secret` when importing one); returns row and secret.

    Names are unique among the active tokens of one role (`Conflict`
    otherwise; a partial unique index holds it under concurrent writers).
    """
    if active_admin_token_named(session, name=name, role=role) is not None:
        raise errors.Conflict(f"An active {role} token named {name!r} already exists.", param="name")
    sealed = (
        credentials.seal_secret(secret, pepper=pepper)
        if secret is not None
        else credentials.new_secret(credentials.ADMIN_TOKEN_PREFIX, pepper=pepper)
    )
    token = AdminToken(
        id=credentials.new_id("adm"),
        name=name,
        role=role,
        prefix=sealed.prefix,
        salt=sealed.salt,
        secret_hash=sealed.secret_hash,
        created_at=_now(now),
    )
    session.add(token)
    session.flush()
    return token, sealed.secret


# pg_advisory_xact_lock key of the admin token bootstrap ("evoladmn"), not the migration's
ADMIN_BOOTSTRAP_LOCK_KEY = 0x65766F6C61646D6E


def lock_admin_bootstrap(session: Session) -> None:
    """Serialize the start-up import of admin tokens across replicas starting
    at once (PostgreSQL: a transaction-level advisory lock, released at
    commit). Without it two replicas both see no `env` token and both insert
    one. SQLite: a write that changes nothing takes the database's write lock
    first, so the reads that follow already see the other process' token."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": ADMIN_BOOTSTRAP_LOCK_KEY})
    else:
        session.execute(sa.text("UPDATE admin_tokens SET name = name WHERE 1 = 0"))


def active_admin_token_named(session: Session, *, name: str, role: str) -> AdminToken | None:
    stmt = sa.select(AdminToken).where(
        AdminToken.name == name, AdminToken.role == role, AdminToken.revoked_at.is_(None)
    )
    return session.scalars(stmt).first()


def find_admin_token(session: Session, *, secret: str, pepper: str) -> AdminToken | None:
    """The active token whose secret this is, or None."""
    candidates: Sequence[AdminToken] = session.scalars(
        sa.select(AdminToken).where(
            AdminToken.prefix == credentials.visible_prefix(secret), AdminToken.revoked_at.is_(None)
        )
    ).all()
    for token in candidates:
        if credentials.verify_secret(secret, salt=token.salt, pepper=pepper, secret_hash=token.secret_hash):
            return token
    return None


def list_admin_tokens(session: Session, *, limit: int = 100, offset: int = 0) -> tuple[list[AdminToken], int]:
    stmt = sa.select(AdminToken).order_by(AdminToken.created_at, AdminToken.id)
    return _page(session, stmt, limit=limit, offset=offset)


def count_active_admin_tokens(session: Session, *, role: str | None = None) -> int:
    stmt = sa.select(sa.func.count()).select_from(AdminToken).where(AdminToken.revoked_at.is_(None))
    if role is not None:
        stmt = stmt.where(AdminToken.role == role)
    return int(session.scalar(stmt) or 0)


def revoke_admin_token(session: Session, *, token_id: str, now: float | None = None) -> AdminToken | None:
    token = session.get(AdminToken, token_id)
    if token is not None and token.revoked_at is None:
        token.revoked_at = _now(now)
    return token
