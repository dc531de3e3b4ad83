"""Admin routes for tenants, their API keys, policies and usage.

Each write and its audit entry commit in one transaction; these routes need
the store and answer 503 while it is unreachable. After the commit a notice
goes on the overrides bus, so every replica's key and policy cache applies
the change at once (a revoked key is refused everywhere within a pub/sub
delivery, not at the next refresh).
"""

# No `from __future__ import annotations`: FastAPI must resolve the local
# `Annotated` dependency aliases at definition time.

from typing import Annotated, Any

from fastapi import APIRouter, Depends, status
from sqlalchemy.orm import Session

from gateway.admin import schemas
from gateway.admin._deps import AdminContext, Limit, Offset, RoleDependency, Since, Until, unix_s
from gateway.admin.auth import AdminPrincipal
from gateway.control.bus import KeyRevoked, TenantChanged
from gateway.http import errors
from gateway.store import repository
from gateway.store.tables import Tenant


def _tenant_or_404(session: Session, tenant_id: str) -> Tenant:
    tenant = repository.get_tenant(session, tenant_id=tenant_id)
    if tenant is None:
        raise errors.NotFound(f"No tenant {tenant_id!r}.", param="tenant_id")
    return tenant


def _tenant_dict(tenant: Tenant) -> dict[str, Any]:
    return schemas.TenantOut.model_validate(tenant).model_dump()


def tenant_routes(ctx: AdminContext, viewer: RoleDependency, operator: RoleDependency) -> APIRouter:  # noqa: C901 - a route table
    router = APIRouter(prefix="/tenants", tags=["tenants"])
    Viewer = Annotated[AdminPrincipal, Depends(viewer)]
    Operator = Annotated[AdminPrincipal, Depends(operator)]
    pepper = ctx.db.pepper

    @router.get("", summary="List tenants", response_model=schemas.Page[schemas.TenantOut])
    async def list_tenants(_: Viewer, limit: Limit = 100, offset: Offset = 0) -> Any:
        rows, total = await ctx.db.run_async(lambda s: repository.list_tenants(s, limit=limit, offset=offset))
        return {"items": rows, "total": total}

    @router.post(
        "",
        summary="Create a tenant (with an optional policy)",
        status_code=status.HTTP_201_CREATED,
        response_model=schemas.TenantOut,
    )
    async def create_tenant(body: schemas.TenantIn, who: Operator) -> Any:
        policy = body.policy.to_policy() if body.policy else None

        def create(s: Session) -> Tenant:
            tenant = repository.create_tenant(s, name=body.name, tenant_id=body.id, policy=policy)
            after = {
                **_tenant_dict(tenant),
                "policy": schemas.PolicyBody.of(repository.get_policy(s, tenant_id=tenant.id)).model_dump(),
            }
            repository.add_audit(
                s,
                actor=who.name,
                actor_id=who.token_id,
                action="tenant.create",
                target=f"tenant:{tenant.id}",
                after=after,
            )
            return tenant

        tenant = await ctx.db.run_async(create)
        await ctx.bus.publish(TenantChanged(tenant.id))
        return tenant

    @router.get("/{tenant_id}", summary="One tenant", response_model=schemas.TenantOut)
    async def get_tenant(tenant_id: str, _: Viewer) -> Any:
        return await ctx.db.run_async(lambda s: _tenant_or_404(s, tenant_id))

    @router.patch("/{tenant_id}", summary="Rename a tenant", response_model=schemas.TenantOut)
    async def patch_tenant(tenant_id: str, body: schemas.TenantPatch, who: Operator) -> Any:
        def rename(s: Session) -> Tenant:
            before = _tenant_dict(_tenant_or_404(s, tenant_id))
            tenant = repository.rename_tenant(s, tenant_id=tenant_id, name=body.name)
            assert tenant is not None
            repository.add_audit(
                s,
                actor=who.name,
                actor_id=who.token_id,
                action="tenant.update",
                target=f"tenant:{tenant_id}",
                before=before,
                after=_tenant_dict(tenant),
            )
            return tenant

        tenant = await ctx.db.run_async(rename)
        await ctx.bus.publish(TenantChanged(tenant_id))
        return tenant

    @router.delete(
        "/{tenant_id}", summary="Delete a tenant, its keys and policy", status_code=status.HTTP_204_NO_CONTENT
    )
    async def delete_tenant(tenant_id: str, who: Operator) -> None:
        def delete(s: Session) -> None:
            before = {
                **_tenant_dict(_tenant_or_404(s, tenant_id)),
                "policy": schemas.PolicyBody.of(repository.get_policy(s, tenant_id=tenant_id)).model_dump(),
            }
            repository.delete_tenant(s, tenant_id=tenant_id)
            repository.add_audit(
                s,
                actor=who.name,
                actor_id=who.token_id,
                action="tenant.delete",
                target=f"tenant:{tenant_id}",
                before=before,
            )

        await ctx.db.run_async(delete)
        await ctx.bus.publish(TenantChanged(tenant_id, deleted=True))

    @router.get(
        "/{tenant_id}/keys",
        summary="List a tenant's API keys (prefixes only)",
        response_model=schemas.Page[schemas.ApiKeyOut],
    )
    async def list_keys(tenant_id: str, _: Viewer, limit: Limit = 100, offset: Offset = 0) -> Any:
        def fetch(s: Session) -> dict[str, Any]:
            _tenant_or_404(s, tenant_id)
            rows, total = repository.list_api_keys(s, tenant_id=tenant_id, limit=limit, offset=offset)
            return {"items": rows, "total": total}

        return await ctx.db.run_async(fetch)

    @router.post(
        "/{tenant_id}/keys",
        summary="Create an API key (the secret is shown once)",
        status_code=status.HTTP_201_CREATED,
        response_model=schemas.ApiKeyCreated,
    )
    async def create_key(tenant_id: str, body: schemas.ApiKeyIn, who: Operator) -> Any:
        def create(s: Session) -> schemas.ApiKeyCreated:
            _tenant_or_404(s, tenant_id)
            key, secret = repository.create_api_key(s, tenant_id=tenant_id, name=body.name, pepper=pepper)
            repository.add_audit(
                s,
                actor=who.name,
                actor_id=who.token_id,
                action="api_key.create",
                target=f"api_key:{key.id}",
                after={"tenant_id": tenant_id, "name": key.name, "prefix": key.prefix},
            )
            return schemas.ApiKeyCreated(id=key.id, name=key.name, prefix=key.prefix, secret=secret)

        created = await ctx.db.run_async(create)
        await ctx.bus.publish(TenantChanged(tenant_id))
        return created

    @router.delete("/{tenant_id}/keys/{key_id}", summary="Revoke an API key", response_model=schemas.ApiKeyOut)
    async def revoke_key(tenant_id: str, key_id: str, who: Operator) -> Any:
        def revoke(s: Session) -> Any:
            key = repository.revoke_api_key(s, tenant_id=tenant_id, key_id=key_id)
            if key is None:
                raise errors.NotFound(f"No key {key_id!r} for tenant {tenant_id!r}.", param="key_id")
            repository.add_audit(
                s,
                actor=who.name,
                actor_id=who.token_id,
                action="api_key.revoke",
                target=f"api_key:{key_id}",
                before={"revoked_at": None},
                after={"revoked_at": key.revoked_at},
            )
            return key

        key = await ctx.db.run_async(revoke)
        await ctx.bus.publish(KeyRevoked(key_id, tenant_id))
        return key

    @router.get("/{tenant_id}/policy", summary="A tenant's policy", response_model=schemas.PolicyBody)
    async def get_policy(tenant_id: str, _: Viewer) -> Any:
        def fetch(s: Session) -> schemas.PolicyBody:
            _tenant_or_404(s, tenant_id)
            return schemas.PolicyBody.of(repository.get_policy(s, tenant_id=tenant_id))

        return await ctx.db.run_async(fetch)

    @router.put("/{tenant_id}/policy", summary="Replace a tenant's policy", response_model=schemas.PolicyBody)
    async def put_policy(tenant_id: str, body: schemas.PolicyBody, who: Operator) -> Any:
        try:
            policy = body.to_policy()
        except ValueError as exc:
            raise errors.InvalidRequest(str(exc), code="invalid_value") from exc

        def store(s: Session) -> schemas.PolicyBody:
            _tenant_or_404(s, tenant_id)
            before = schemas.PolicyBody.of(repository.get_policy(s, tenant_id=tenant_id))
            repository.put_policy(s, tenant_id=tenant_id, policy=policy)
            repository.add_audit(
                s,
                actor=who.name,
                actor_id=who.token_id,
                action="policy.update",
                target=f"tenant:{tenant_id}",
                before=before.model_dump(),
                after=body.model_dump(),
            )
            return body

        stored = await ctx.db.run_async(store)
        await ctx.bus.publish(TenantChanged(tenant_id))
        return stored

    @router.get(
        "/{tenant_id}/usage",
        summary="Usage per minute and model over a time range",
        response_model=schemas.Page[schemas.UsageRow],
    )
    async def get_usage(tenant_id: str, _: Viewer, since: Since = None, until: Until = None) -> Any:
        def fetch(s: Session) -> dict[str, Any]:
            _tenant_or_404(s, tenant_id)
            rows = repository.list_usage(s, tenant_id=tenant_id, since=unix_s(since), until=unix_s(until))
            return {"items": rows, "total": len(rows)}

        return await ctx.db.run_async(fetch)

    return router
