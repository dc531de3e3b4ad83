"""`build_admin_router`: the `/admin` API over the live cluster and the store.

Mount it on the gateway app and install the OpenAI-shaped error handlers:

    app.include_router(build_admin_router(control=cluster, db=db, sink=sink))
    install_error_handlers(app)

Auth: `Authorization: Bearer <admin token>`; viewers may only GET, operators
may also write; tenant API keys are rejected (401). Every write is audited
(actor, action, target, before, after).
"""

from __future__ import annotations

from fastapi import APIRouter

from gateway.admin._access_routes import access_routes
from gateway.admin._cluster_routes import cluster_routes
from gateway.admin._deps import AdminContext, AdminControl, ChangeNotices, _NoNotices, role_dependencies
from gateway.admin._request_routes import request_routes
from gateway.admin._tenant_routes import tenant_routes
from gateway.admin.auth import AdminAuthenticator
from gateway.control.overrides import OverridesService
from gateway.http.error_responses import install_error_handlers
from gateway.serving.turn.requestlog import RequestLog
from gateway.store.db import Database
from gateway.store.sink import EventSink

ERROR_RESPONSES: dict[int | str, dict[str, str]] = {
    400: {"description": "Invalid request (OpenAI-shaped error)"},
    401: {"description": "Missing or invalid admin token"},
    403: {"description": "Viewer token used for a write"},
    404: {"description": "Unknown tenant, key, node or token"},
    409: {"description": "Conflict (duplicate name, last operator token)"},
    503: {"description": "The store is unreachable"},
}


def build_admin_router(
    *,
    control: AdminControl,
    db: Database,
    sink: EventSink,
    auth: AdminAuthenticator | None = None,
    overrides: OverridesService | None = None,
    bus: ChangeNotices | None = None,
    requests: RequestLog | None = None,
    prefix: str = "/admin",
) -> APIRouter:
    """The admin API. `control` implements `ClusterControl` and `ClusterHistory`;
    `overrides` defaults to an `OverridesService` over `control` recording to `sink`;
    `bus` gets a notice of every tenant, key and policy change (other replicas
    apply it at once), none by default. `requests`: the serving side's request
    log, read at `/admin/requests` (operators), when given."""
    ctx = AdminContext(
        control=control,
        overrides=overrides or OverridesService(control, sink),
        db=db,
        sink=sink,
        auth=auth or AdminAuthenticator(db),
        bus=bus or _NoNotices(),
    )
    viewer, operator = role_dependencies(ctx.auth)
    router = APIRouter(prefix=prefix, responses=ERROR_RESPONSES)
    for build in (access_routes, cluster_routes, tenant_routes):
        router.include_router(build(ctx, viewer, operator))
    if requests is not None:
        router.include_router(request_routes(requests, operator))
    return router


__all__ = ["build_admin_router", "install_error_handlers"]
