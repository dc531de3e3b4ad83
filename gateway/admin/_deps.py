"""Shared pieces of the admin routes: the context they close over, role
dependencies, paging parameters and CSV rendering."""

import csv
import io
import json
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, Protocol

from fastapi import Depends, Query
from fastapi.responses import Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from gateway.admin.auth import AdminAuthenticator, AdminPrincipal
from gateway.control.bus import BusEvent
from gateway.control.overrides import OverridesService
from gateway.control.ports import ClusterControl, ClusterHistory
from gateway.http import errors
from gateway.store.db import Database
from gateway.store.sink import EventSink


class AdminControl(ClusterControl, ClusterHistory, Protocol):
    """What the admin API needs from the live cluster."""


class ChangeNotices(Protocol):
    """The overrides bus (`gateway.control.bus`): tells every replica about a change."""

    async def publish(self, published: BusEvent) -> Any: ...


class _NoNotices:
    async def publish(self, published: BusEvent) -> None:
        return None


@dataclass(frozen=True)
class AdminContext:
    control: AdminControl
    overrides: OverridesService
    db: Database
    sink: EventSink
    auth: AdminAuthenticator
    bus: ChangeNotices = _NoNotices()


Limit = Annotated[int, Query(ge=1, le=10_000, description="page size")]
Offset = Annotated[int, Query(ge=0, le=2**31 - 1, description="rows to skip")]
Since = Annotated[float | datetime | None, Query(description="unix seconds or ISO-8601, inclusive")]
Until = Annotated[float | datetime | None, Query(description="unix seconds or ISO-8601, exclusive")]
Format = Annotated[Literal["json", "csv"], Query(description="`csv` for a spreadsheet export")]


def unix_s(value: float | datetime | None) -> float | None:
    """A `Since`/`Until` value as unix seconds (naive datetimes are UTC)."""
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()
    return value


_bearer = HTTPBearer(auto_error=False, description="Admin token (viewer or operator)")

RoleDependency = Callable[..., Awaitable[AdminPrincipal]]


def role_dependencies(auth: AdminAuthenticator) -> tuple[RoleDependency, RoleDependency]:
    """(viewer, operator) dependencies: any admin token, and operator tokens only."""

    async def viewer(creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> AdminPrincipal:
        return await auth.authenticate(creds.credentials if creds else None)

    async def operator(principal: Annotated[AdminPrincipal, Depends(viewer)]) -> AdminPrincipal:
        if not principal.can_write:
            raise errors.PermissionDenied(
                "This action needs an operator token; yours is a viewer token.", code="insufficient_role"
            )
        return principal

    return viewer, operator


def csv_response(rows: Iterable[dict[str, Any]], columns: list[str], filename: str) -> Response:
    """Rows as CSV; nested values are written as JSON."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: json.dumps(v) if isinstance(v, (dict, list, tuple)) else v for k, v in row.items()})
    return Response(
        out.getvalue(), media_type="text/csv", headers={"Content-Disposition": f'attachment; filename="{filename}"'}
    )


CSV_RESPONSES: dict[int | str, dict[str, Any]] = {200: {"content": {"text/csv": {}}}}
