"""The console's only door to the gateway: a small typed client for the admin API.

Every HTTP call the console makes goes through `AdminClient`, so when the
admin API's shapes move only this file changes. Failures of any kind (HTTP
error status, unreachable server, a body that is not JSON) become one
`AdminApiError` whose `str()` is a sentence an operator can act on; pages
show it with `st.error` and never a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

JSON = dict[str, Any]
CSV_MAX_ROWS = 10_000  # the admin API's page-size ceiling

# HTTP status → what an operator should read when the server gave no message.
_STATUS_HINTS: dict[int, str] = {
    400: "The request was rejected",
    401: "The admin token was not accepted; log in again",
    403: "This token's role may not do that",
    404: "Not found",
    409: "Conflict with the current state",
    422: "The request was rejected",
    429: "Too many requests; try again shortly",
    500: "The admin API failed",
    502: "A worker behind the gateway failed",
    503: "The admin API is unavailable",
}


class AdminApiError(Exception):
    """A failed admin API call, already phrased for an operator.

    `status` is the HTTP status, or 0 when no response came back (connection
    refused, timeout). `type`, `code` and `param` mirror the OpenAI-shaped
    error body when the server sent one.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int = 0,
        type: str | None = None,
        code: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type
        self.code = code
        self.param = param

    def __str__(self) -> str:
        where = f" (field `{self.param}`)" if self.param else ""
        status = f"HTTP {self.status}: " if self.status else ""
        return f"{status}{self.message}{where}"


def _error_from_response(response: httpx.Response) -> AdminApiError:
    hint = _STATUS_HINTS.get(response.status_code, f"Unexpected HTTP {response.status_code}")
    try:
        body = response.json()
    except ValueError:
        return AdminApiError(hint, status=response.status_code)
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict):
        message = str(err.get("message") or hint)
        return AdminApiError(
            message, status=response.status_code, type=err.get("type"), code=err.get("code"), param=err.get("param")
        )
    detail = body.get("detail") if isinstance(body, dict) else None
    if isinstance(detail, list):  # FastAPI validation errors, should the API ever leak one
        parts = [f"{'.'.join(str(p) for p in d.get('loc', [])[1:])}: {d.get('msg')}" for d in detail]
        return AdminApiError(f"{hint}: " + "; ".join(parts), status=response.status_code)
    return AdminApiError(str(detail) if detail else hint, status=response.status_code)


@dataclass(frozen=True)
class Identity:
    name: str
    role: str  # "viewer" | "operator"

    @property
    def can_write(self) -> bool:
        return self.role == "operator"


def _params(**values: Any) -> dict[str, Any]:
    """Query parameters without the unset ones; booleans as the API spells them."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if value is None or value == "":
            continue
        out[key] = str(value).lower() if isinstance(value, bool) else value
    return out


class AdminClient:
    """Synchronous client for `/admin/*`, authenticated with one admin token.

    Streamlit reruns the page script on every interaction, so calls are plain
    blocking requests with a short timeout; `transport` lets unit tests plug
    in `httpx.MockTransport`.
    """

    def __init__(
        self, base_url: str, token: str, *, timeout_s: float = 10.0, transport: httpx.BaseTransport | None = None
    ) -> None:
        # Accept both the gateway's base URL and its /admin mount point.
        self.base_url = base_url.rstrip("/").removesuffix("/admin")
        self._http = httpx.Client(
            base_url=self.base_url, timeout=timeout_s, transport=transport, headers={"Authorization": f"Bearer {token}"}
        )

    def close(self) -> None:
        self._http.close()

    # -- plumbing -----------------------------------------------------------
    def _request(
        self, method: str, path: str, *, params: dict[str, Any] | None = None, body: Any = None
    ) -> httpx.Response:
        try:
            response = self._http.request(method, "/admin" + path, params=params, json=body)
        except httpx.TimeoutException:
            raise AdminApiError(f"The admin API at {self.base_url} did not answer in time") from None
        except httpx.HTTPError as exc:
            raise AdminApiError(f"Cannot reach the admin API at {self.base_url} ({exc})") from None
        if response.status_code >= 400:
            raise _error_from_response(response)
        return response

    def _json(self, method: str, path: str, *, params: dict[str, Any] | None = None, body: Any = None) -> Any:
        response = self._request(method, path, params=params, body=body)
        if response.status_code == 204 or not response.content:
            return {}
        try:
            return response.json()
        except ValueError:
            raise AdminApiError(f"The admin API answered {path} with something that is not JSON") from None

    def _items(self, path: str, params: dict[str, Any] | None = None) -> list[JSON]:
        data = self._json("GET", path, params=params)
        return list(data.get("items", [])) if isinstance(data, dict) else list(data)

    def _page(self, path: str, params: dict[str, Any]) -> tuple[list[JSON], int]:
        data = self._json("GET", path, params=params)
        items = list(data.get("items", []))
        return items, int(data.get("total", len(items)))

    def _csv(self, path: str, params: dict[str, Any]) -> bytes:
        # The export is not paged: ask for the admin API's largest page.
        query = {**params, "format": "csv", "limit": CSV_MAX_ROWS}
        query.pop("offset", None)
        return self._request("GET", path, params=query).content

    # -- identity and cluster -------------------------------------------------
    def whoami(self) -> Identity:
        data = self._json("GET", "/whoami")
        return Identity(name=str(data.get("name", "?")), role=str(data.get("role", "viewer")))

    def cluster(self) -> JSON:
        return self._json("GET", "/cluster")

    def cluster_history(self, minutes: int = 60) -> list[JSON]:
        return self._items("/cluster/history", {"minutes": minutes})

    # -- planner, pins, switches ----------------------------------------------
    def planner(self) -> JSON:
        return self._json("GET", "/planner")

    def set_mode(self, mode: str) -> JSON:
        return self._json("PUT", "/planner/mode", body={"mode": mode})

    def pins(self) -> JSON:
        return self._json("GET", "/pins")

    def pin_split(self, prefill_nodes: int) -> JSON:
        return self._json("PUT", "/pins/split", body={"prefill_nodes": prefill_nodes})

    def unpin_split(self) -> JSON:
        return self._json("DELETE", "/pins/split")

    def pin_node(self, node_id: str, phase: str) -> JSON:
        return self._json("PUT", f"/pins/nodes/{node_id}", body={"phase": phase})

    def unpin_node(self, node_id: str) -> JSON:
        return self._json("DELETE", f"/pins/nodes/{node_id}")

    def switch(self, node_id: str, to_phase: str, reason: str) -> JSON:
        return self._json("POST", "/switch", body={"node_id": node_id, "to_phase": to_phase, "reason": reason})

    # -- history ----------------------------------------------------------------
    def switches(
        self,
        *,
        since: float | str | None = None,  # unix seconds or ISO-8601
        until: float | str | None = None,
        node: str | None = None,
        reason: str | None = None,
        outcome: str | None = None,
        limit: int = 500,
        offset: int = 0,
    ) -> tuple[list[JSON], int]:
        return self._page(
            "/switches",
            _params(since=since, until=until, node=node, reason=reason, outcome=outcome, limit=limit, offset=offset),
        )

    def switches_csv(self, **filters: Any) -> bytes:
        return self._csv("/switches", _params(**filters))

    def decisions(
        self,
        *,
        since: float | str | None = None,  # unix seconds or ISO-8601
        until: float | str | None = None,
        acted: bool | None = None,
        checked: bool | None = None,
        limit: int = 500,
        offset: int = 0,
    ) -> tuple[list[JSON], int]:
        params = _params(since=since, until=until, acted=acted, checked=checked, limit=limit, offset=offset)
        return self._page("/decisions", params)

    def decisions_csv(self, **filters: Any) -> bytes:
        return self._csv("/decisions", _params(**filters))

    def audit(self, *, limit: int = 200) -> list[JSON]:
        return self._items("/audit", {"limit": limit})

    # -- tenants ------------------------------------------------------------------
    def tenants(self) -> list[JSON]:
        return self._items("/tenants", {"limit": 1000})

    def create_tenant(self, name: str) -> JSON:
        return self._json("POST", "/tenants", body={"name": name})

    def update_tenant(self, tenant_id: str, changes: JSON) -> JSON:
        return self._json("PATCH", f"/tenants/{tenant_id}", body=changes)

    def delete_tenant(self, tenant_id: str) -> JSON:
        return self._json("DELETE", f"/tenants/{tenant_id}")

    def keys(self, tenant_id: str) -> list[JSON]:
        return self._items(f"/tenants/{tenant_id}/keys")

    def create_key(self, tenant_id: str, name: str | None = None) -> JSON:
        """{"id", "prefix", "secret"}; the secret is never returned again."""
        return self._json("POST", f"/tenants/{tenant_id}/keys", body={"name": name} if name else {})

    def revoke_key(self, tenant_id: str, key_id: str) -> JSON:
        return self._json("DELETE", f"/tenants/{tenant_id}/keys/{key_id}")

    def policy(self, tenant_id: str) -> JSON:
        return self._json("GET", f"/tenants/{tenant_id}/policy")

    def set_policy(self, tenant_id: str, policy: JSON) -> JSON:
        return self._json("PUT", f"/tenants/{tenant_id}/policy", body=policy)

    def usage(self, tenant_id: str, *, since: str | None = None, until: str | None = None) -> list[JSON]:
        return self._items(f"/tenants/{tenant_id}/usage", _params(since=since, until=until))
