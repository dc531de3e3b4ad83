"""Admin routes about access: who am I, the audit log, admin tokens."""

# No `from __future__ import annotations`: FastAPI must resolve the local
# `Annotated` dependency aliases at definition time.

from typing import Annotated, Any

from fastapi import APIRouter, Depends, status
from sqlalchemy.orm import Session

from gateway.admin import schemas
from gateway.admin._deps import AdminContext, Limit, Offset, RoleDependency, Since, Until, unix_s
from gateway.admin.auth import OPERATOR, AdminPrincipal
from gateway.control.bus import AdminTokenRevoked
from gateway.http import errors
from gateway.store import repository


def _token_dict(row: Any) -> dict[str, Any]:
    return schemas.AdminTokenOut.model_validate(row).model_dump()


def access_routes(ctx: AdminContext, viewer: RoleDependency, operator: RoleDependency) -> APIRouter:
    router = APIRouter(tags=["access"])
    Viewer = Annotated[AdminPrincipal, Depends(viewer)]
    Operator = Annotated[AdminPrincipal, Depends(operator)]

    @router.get("/whoami", summary="The caller's admin identity", response_model=schemas.WhoAmI)
    async def whoami(who: Viewer) -> schemas.WhoAmI:
        return schemas.WhoAmI(name=who.name, role=who.role)

    @router.get(
        "/audit", summary="Audit log of admin actions, newest first", response_model=schemas.Page[schemas.AuditOut]
    )
    async def get_audit(
        _: Viewer,
        since: Since = None,
        until: Until = None,
        actor: str | None = None,
        actor_id: str | None = None,
        action: str | None = None,
        limit: Limit = 100,
        offset: Offset = 0,
    ) -> Any:
        rows, total = await ctx.db.run_async(
            lambda s: repository.list_audit(
                s,
                since=unix_s(since),
                until=unix_s(until),
                actor=actor,
                actor_id=actor_id,
                action=action,
                limit=limit,
                offset=offset,
            )
        )
        return {"items": rows, "total": total}

    @router.get(
        "/tokens", summary="List admin tokens (operator only)", response_model=schemas.Page[schemas.AdminTokenOut]
    )
    async def list_tokens(_: Operator, limit: Limit = 100, offset: Offset = 0) -> Any:
        rows, total = await ctx.db.run_async(lambda s: repository.list_admin_tokens(s, limit=limit, offset=offset))
        return {"items": rows, "total": total}

    @router.post(
        "/tokens",
        summary="Create an admin token (the secret is shown once)",
        status_code=status.HTTP_201_CREATED,
        response_model=schemas.AdminTokenCreated,
    )
    async def create_token(body: schemas.AdminTokenIn, who: Operator) -> Any:
        def create(s: Session) -> schemas.AdminTokenCreated:
            row, secret = repository.create_admin_token(s, name=body.name, role=body.role, pepper=ctx.db.pepper)
            repository.add_audit(
                s,
                actor=who.name,
                actor_id=who.token_id,
                action="admin_token.create",
                target=f"admin_token:{row.id}",
                after=_token_dict(row),
            )
            return schemas.AdminTokenCreated(id=row.id, name=row.name, role=body.role, prefix=row.prefix, secret=secret)

        return await ctx.db.run_async(create)

    @router.delete(
        "/tokens/{token_id}", summary="Revoke an admin token (operator only)", response_model=schemas.AdminTokenOut
    )
    async def revoke_token(token_id: str, who: Operator) -> Any:
        def revoke(s: Session) -> Any:
            row = repository.revoke_admin_token(s, token_id=token_id)
            if row is None:
                raise errors.NotFound(f"No admin token {token_id!r}.", param="token_id")
            if row.role == OPERATOR and repository.count_active_admin_tokens(s, role=OPERATOR) == 0:
                raise errors.Conflict("Refusing to revoke the last operator token.")
            repository.add_audit(
                s,
                actor=who.name,
                actor_id=who.token_id,
                action="admin_token.revoke",
                target=f"admin_token:{token_id}",
                before={"revoked_at": None},
                after={"revoked_at": row.revoked_at},
            )
            return row

        row = await ctx.db.run_async(revoke)
        ctx.auth.forget(token_id)
        await ctx.bus.publish(AdminTokenRevoked(token_id))  # the other replicas' caches
        return row

    return router
