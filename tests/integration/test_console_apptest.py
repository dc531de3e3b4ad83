"""The operator console driven by Streamlit's AppTest against a live admin API.

The admin API is real HTTP (uvicorn on localhost) over a real SQLite store;
only the cluster behind it is a `FakeClusterControl` (tests/integration/console_live.py).
"""

from __future__ import annotations

import pathlib
import re
from collections.abc import Iterator
from dataclasses import replace

import httpx
import pytest
from streamlit.testing.v1 import AppTest

from testing.console_live import LiveAdminApi, live_admin_api

APP = str(pathlib.Path(__file__).resolve().parents[2] / "admin_ui" / "app.py")


@pytest.fixture
def api(tmp_path: pathlib.Path) -> Iterator[LiveAdminApi]:
    with live_admin_api(tmp_path) as live:
        yield live


def console(api_url: str, monkeypatch: pytest.MonkeyPatch) -> AppTest:
    monkeypatch.setenv("EVOLVING_ADMIN_URL", api_url)
    at = AppTest.from_file(APP, default_timeout=30)
    at.run()
    assert not at.exception
    return at


def log_in(at: AppTest, token: str) -> AppTest:
    at.text_input(key="login_token").input(token)
    at.button[0].click().run()  # the form's "Log in"
    assert not at.exception
    return at


def split_pin(api: LiveAdminApi) -> int | None:
    """Read through a call: after `split_pin is None` mypy would take it for None still."""
    return api.control.split_pin


def open_page(at: AppTest, page: str) -> AppTest:
    at.switch_page(f"views/{page}.py").run()
    assert not at.exception, at.exception
    return at


def errors(at: AppTest) -> list[str]:
    return [e.value for e in at.error]


def charts(at: AppTest) -> int:
    return len(at.get("vega_lite_chart"))


def admin(api: LiveAdminApi, method: str, path: str, **kw: object) -> httpx.Response:
    headers = {"Authorization": f"Bearer {api.tokens['operator']}"}
    # kw: httpx.request's own keywords (json=, params=), passed through untyped.
    return httpx.request(method, api.url + "/admin" + path, headers=headers, timeout=10, **kw)  # type: ignore[arg-type]


def test_login_rejects_bad_token_with_readable_message(api: LiveAdminApi, monkeypatch: pytest.MonkeyPatch) -> None:
    at = log_in(console(api.url, monkeypatch), "eia-not-a-token")
    assert any("Login failed" in e and "401" in e for e in errors(at))
    assert at.text_input(key="login_token")  # still on the login page


def test_unreachable_admin_api_is_an_error_message_not_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    at = log_in(console("http://127.0.0.1:9", monkeypatch), "eia-whatever")
    assert any("Cannot reach the admin API" in e for e in errors(at))


def test_cluster_page_draws_tiles_by_phase_and_marks_draining(
    api: LiveAdminApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = log_in(console(api.url, monkeypatch), api.tokens["operator"])
    assert at.title[0].value == "Cluster"  # the default page
    picture = at.html[0].value
    for i in range(4):
        assert f'data-node="node-{i}"' in picture
    assert picture.count('data-phase="prefill"') == 2 and picture.count('data-phase="decode"') == 2
    assert 'data-node="node-3" data-phase="decode" data-draining="yes"' in picture
    assert "draining → prefill" in picture
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Split (P/D)"] == "2 / 2" and metrics["Nodes"] == "4"
    assert charts(at) == 1  # split and throughput over the last hour
    assert at.toggle(key="cluster_auto_refresh").value is True


def test_planner_pins_split_after_confirmation_and_shows_result(
    api: LiveAdminApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = open_page(log_in(console(api.url, monkeypatch), api.tokens["operator"]), "planner")
    assert charts(at) == 1  # predictions with confidence bands
    # Shown while idle, with their age and why nothing newer exists.
    caption = " ".join(c.value for c in at.caption)
    assert re.search(r"Made at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC, (8\d|9\d) s ago|2 min ago", caption), caption
    assert "decides without predicting: hold: insufficient data." in caption
    at.number_input(key="pin_split_prefill").set_value(3).run()
    at.button(key="pin_split").click().run()
    assert any("3 prefill / 1 decode" in w.value for w in at.warning)
    assert split_pin(api) is None  # nothing happens before confirming
    at.button(key="pin_split__confirm").click().run()
    assert not at.exception
    assert split_pin(api) == 3
    assert any(s.value == "Done." for s in at.success)
    assert admin(api, "GET", "/pins").json()["split"] == 3
    assert "Split pin: **3 prefill nodes**" in " ".join(m.value for m in at.markdown)

    at.button(key="unpin_split").click().run()
    at.button(key="unpin_split__cancel").click().run()
    assert split_pin(api) == 3  # cancelled
    at.button(key="unpin_split").click().run()
    at.button(key="unpin_split__confirm").click().run()
    assert split_pin(api) is None


def test_planner_mode_node_pin_and_manual_switch(api: LiveAdminApi, monkeypatch: pytest.MonkeyPatch) -> None:
    at = open_page(log_in(console(api.url, monkeypatch), api.tokens["operator"]), "planner")
    at.radio(key="planner_mode_choice").set_value("advisory").run()
    at.button(key="set_mode").click().run()
    at.button(key="set_mode__confirm").click().run()
    assert api.control.mode == "advisory"

    at.selectbox(key="pin_node_id").set_value("node-0").run()
    at.radio(key="pin_node_phase").set_value("decode").run()
    at.button(key="pin_node").click().run()
    at.button(key="pin_node__confirm").click().run()
    assert api.control.nodes["node-0"].pinned_phase == "decode"
    assert api.control.nodes["node-0"].phase == "decode"

    at.selectbox(key="switch_node_id").set_value("node-1").run()
    at.text_input(key="switch_reason").input("maintenance").run()
    at.button(key="manual_switch").click().run()
    at.button(key="manual_switch__confirm").click().run()
    assert not at.exception
    assert api.control.nodes["node-1"].phase == "decode"
    shown = [j.value for j in at.json]
    assert any('"outcome"' in str(v) and "node-1" in str(v) for v in shown), shown


def test_history_filters_and_csv(api: LiveAdminApi, monkeypatch: pytest.MonkeyPatch) -> None:
    at = open_page(log_in(console(api.url, monkeypatch), api.tokens["operator"]), "history")
    assert not errors(at)
    assert charts(at) == 1  # timeline
    switches, decisions = at.dataframe[0].value, at.dataframe[1].value
    assert len(switches) == 4 and set(switches["node"]) == {"node-1", "node-2"}
    assert len(decisions) == 8
    assert len(at.get("download_button")) == 2

    at.selectbox(key="hist_node").set_value("node-1").run()
    assert list(at.dataframe[0].value["reason"]) == ["manual: maintenance"]
    at.selectbox(key="hist_acted").set_value("acted").run()
    assert set(at.dataframe[1].value["acted"]) == {True}
    at.selectbox(key="hist_range").set_value("Last hour").run()
    assert len(at.dataframe[0].value) == 1 and len(at.dataframe[1].value) == 1  # seeded 30 min ago
    at.text_input(key="hist_reason").input("nothing-like-this").run()
    assert len(at.dataframe[0].value) == 0


def test_tenants_keys_policy_usage(api: LiveAdminApi, monkeypatch: pytest.MonkeyPatch) -> None:
    at = open_page(log_in(console(api.url, monkeypatch), api.tokens["operator"]), "tenants")
    assert set(at.dataframe[0].value["name"]) == {"acme", "globex"}
    assert at.selectbox(key="tenant_id").value == "acme"
    assert charts(at) == 1  # usage
    assert {m.label for m in at.metric} >= {"Requests", "Completion tokens"}

    at.text_input(key="new_key_name").input("laptop").run()
    at.button(key="create_key").click().run()
    secret = at.code[0].value
    assert secret.startswith("sk-ei-")
    assert any("will not be shown again" in w.value for w in at.warning)
    assert "laptop" in list(at.dataframe[1].value["name"])  # the table already lists it
    keys = admin(api, "GET", "/tenants/acme/keys").json()["items"]
    assert len(keys) == 2 and all(secret not in str(k) for k in keys)
    at.run()
    assert not at.code  # shown once

    new = next(k for k in keys if k["name"] == "laptop")
    at.selectbox(key="revoke_key_id").set_value(new["id"]).run()
    at.button(key="revoke_key").click().run()
    at.button(key="revoke_key__confirm").click().run()
    keys = {k["id"]: k for k in admin(api, "GET", "/tenants/acme/keys").json()["items"]}
    assert keys[new["id"]]["revoked_at"] is not None

    at.number_input(key="pol_acme_requests_per_minute").set_value(0)
    at.button(key="FormSubmitter:policy_acme-Save policy").click().run()
    assert any("Requests per minute must be at least 1" in e for e in errors(at))
    assert admin(api, "GET", "/tenants/acme/policy").json()["requests_per_minute"] is None

    at.number_input(key="pol_acme_requests_per_minute").set_value(120)
    at.number_input(key="pol_acme_priority").set_value(0)
    at.text_input(key="pol_acme_models").input("demo, demo-large")
    at.button(key="FormSubmitter:policy_acme-Save policy").click().run()
    assert any(s.value == "Policy saved." for s in at.success)
    policy = admin(api, "GET", "/tenants/acme/policy").json()
    assert policy["requests_per_minute"] == 120 and policy["priority"] == 0
    assert list(policy["allowed_models"]) == ["demo", "demo-large"]


def test_tenant_api_error_is_shown_as_message(api: LiveAdminApi, monkeypatch: pytest.MonkeyPatch) -> None:
    at = open_page(log_in(console(api.url, monkeypatch), api.tokens["operator"]), "tenants")
    at.text_input(key="new_tenant_name").input("acme")
    at.button(key="FormSubmitter:create_tenant-Create tenant").click().run()
    assert not at.exception
    assert any("409" in e and "already exists" in e for e in errors(at))

    at.text_input(key="new_tenant_name").input("initech")
    at.button(key="FormSubmitter:create_tenant-Create tenant").click().run()
    assert "initech" in {t["name"] for t in admin(api, "GET", "/tenants").json()["items"]}


def test_cache_page_shows_directory_and_top_branches(api: LiveAdminApi, monkeypatch: pytest.MonkeyPatch) -> None:
    at = open_page(log_in(console(api.url, monkeypatch), api.tokens["operator"]), "cache")
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Blocks"] == "18,432" and metrics["Hit rate"] == "63.0%"
    assert metrics["Bytes"] == "36.0 GiB"
    assert charts(at) == 1
    assert list(at.dataframe[0].value["branch_id"])[:2] == ["br-0", "br-1"]
    assert not at.warning


def test_cache_page_says_when_the_directory_is_unreachable(api: LiveAdminApi, monkeypatch: pytest.MonkeyPatch) -> None:
    reachable = api.control.directory
    api.control.directory = replace(reachable, available=False)
    try:
        at = open_page(log_in(console(api.url, monkeypatch), api.tokens["operator"]), "cache")
    finally:
        api.control.directory = reachable
    assert [w.value for w in at.warning] == [
        "The KV directory is unreachable: the last numbers it gave; no request gets cache hits."
    ]
    assert {m.label: m.value for m in at.metric}["Blocks"] == "18,432"


def test_viewer_sees_everything_and_changes_nothing(api: LiveAdminApi, monkeypatch: pytest.MonkeyPatch) -> None:
    at = log_in(console(api.url, monkeypatch), api.tokens["viewer"])
    assert any("read-only" in i.value for i in at.sidebar.info)
    for page in ("cluster", "planner", "history", "tenants", "cache"):
        open_page(at, page)
        assert not errors(at), (page, errors(at))
    open_page(at, "planner")
    for key in ("pin_split", "set_mode", "pin_node", "manual_switch"):
        assert at.button(key=key).disabled, key
    open_page(at, "tenants")
    assert at.button(key="create_key").disabled and at.button(key="revoke_key").disabled
    assert at.button(key="FormSubmitter:policy_acme-Save policy").disabled


def test_logout_returns_to_login(api: LiveAdminApi, monkeypatch: pytest.MonkeyPatch) -> None:
    at = log_in(console(api.url, monkeypatch), api.tokens["operator"])
    at.sidebar.button(key="logout").click().run()
    assert at.text_input(key="login_token")
    assert at.session_state["console_settings"].admin_url == api.url


def test_revoked_token_returns_to_login_saying_why(api: LiveAdminApi, monkeypatch: pytest.MonkeyPatch) -> None:
    at = open_page(log_in(console(api.url, monkeypatch), api.tokens["viewer"]), "cache")
    tokens = admin(api, "GET", "/tokens").json()["items"]
    viewer_id = next(t["id"] for t in tokens if t["role"] == "viewer")
    assert admin(api, "DELETE", f"/tokens/{viewer_id}").status_code == 200
    at.run()
    assert not at.exception
    assert at.text_input(key="login_token")
    assert any("Logged out" in w.value and "401" in w.value for w in at.warning)
