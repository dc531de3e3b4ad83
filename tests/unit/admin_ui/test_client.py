"""AdminClient over httpx.MockTransport: requests as the admin API expects them,
failures as one readable AdminApiError."""

from __future__ import annotations

import json

import httpx
import pytest

from admin_ui.client import AdminApiError, AdminClient


def client_for(handler: object) -> tuple[AdminClient, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        # handler: any callable the test hands in, kept as object so lambdas fit.
        return handler(request)  # type: ignore[operator]

    return AdminClient("http://gw:8000/", "eia-secret", transport=httpx.MockTransport(record)), seen


def test_bearer_token_and_paths() -> None:
    client, seen = client_for(lambda r: httpx.Response(200, json={"name": "alice", "role": "operator"}))
    who = client.whoami()
    assert (who.name, who.role, who.can_write) == ("alice", "operator", True)
    assert seen[0].headers["Authorization"] == "Bearer eia-secret"
    assert seen[0].url == "http://gw:8000/admin/whoami"


def test_admin_mount_point_in_the_url_is_accepted() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={})

    transport = httpx.MockTransport(handler)
    AdminClient("http://gw:8000/admin/", "t", transport=transport).cluster()
    assert seen[0].url == "http://gw:8000/admin/cluster"


def test_list_filters_drop_unset_and_spell_booleans() -> None:
    client, seen = client_for(lambda r: httpx.Response(200, json={"items": [{"id": 1}], "total": 7}))
    items, total = client.decisions(since=100.0, acted=False, limit=5)
    assert (items, total) == ([{"id": 1}], 7)
    assert dict(seen[0].url.params) == {"since": "100.0", "acted": "false", "limit": "5", "offset": "0"}
    client.switches(node="node-1", reason="")
    assert dict(seen[1].url.params) == {"node": "node-1", "limit": "500", "offset": "0"}


def test_csv_export_asks_for_csv_and_returns_bytes() -> None:
    client, seen = client_for(
        lambda r: httpx.Response(200, content=b"id,t\n1,2\n", headers={"content-type": "text/csv"})
    )
    assert client.switches_csv(node="node-2") == b"id,t\n1,2\n"
    assert seen[0].url.params["format"] == "csv" and seen[0].url.params["node"] == "node-2"


def test_writes_send_json_bodies() -> None:
    client, seen = client_for(lambda r: httpx.Response(200, json={"split": 3, "nodes": {}}))
    client.pin_split(3)
    client.switch("node-1", "decode", "maintenance")
    assert (seen[0].method, seen[0].url.path, json.loads(seen[0].content)) == (
        "PUT",
        "/admin/pins/split",
        {"prefill_nodes": 3},
    )
    assert json.loads(seen[1].content) == {"node_id": "node-1", "to_phase": "decode", "reason": "maintenance"}


def test_no_content_is_an_empty_dict() -> None:
    client, _ = client_for(lambda r: httpx.Response(204))
    assert client.delete_tenant("acme") == {}


def test_openai_shaped_error_becomes_readable_message() -> None:
    body = {
        "error": {
            "message": "priority must be 0..3",
            "type": "invalid_request_error",
            "param": "priority",
            "code": "invalid_value",
        }
    }
    client, _ = client_for(lambda r: httpx.Response(400, json=body))
    with pytest.raises(AdminApiError) as caught:
        client.set_policy("acme", {"priority": 9})
    err = caught.value
    assert (err.status, err.code, err.param) == (400, "invalid_value", "priority")
    assert str(err) == "HTTP 400: priority must be 0..3 (field `priority`)"


@pytest.mark.parametrize(
    ("status", "expected"), [(401, "log in again"), (503, "unavailable"), (418, "Unexpected HTTP 418")]
)
def test_error_without_body_uses_a_hint(status: int, expected: str) -> None:
    client, _ = client_for(lambda r: httpx.Response(status, text="<html>oops</html>"))
    with pytest.raises(AdminApiError, match=expected):
        client.cluster()


def test_unreachable_and_timeout_are_admin_api_errors() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    with pytest.raises(AdminApiError, match="Cannot reach the admin API at http://gw:8000") as caught:
        client_for(refuse)[0].cluster()
    assert caught.value.status == 0
    with pytest.raises(AdminApiError, match="did not answer in time"):
        client_for(slow)[0].cluster()


def test_non_json_success_body_is_an_error() -> None:
    client, _ = client_for(lambda r: httpx.Response(200, text="not json"))
    with pytest.raises(AdminApiError, match="not JSON"):
        client.planner()
