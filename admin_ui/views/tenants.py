"""Tenants page: tenants, their API keys, policies and usage."""

from __future__ import annotations

import time
from typing import Any

import streamlit as st

from admin_ui import charts, session
from admin_ui.client import JSON
from admin_ui.forms import LIMIT_LABELS, MAX_PRIORITY, validate_policy
from admin_ui.widgets import READ_ONLY_HELP, confirmed_action, fetch, fmt_time

NEW_KEY = "tenants__new_key"  # session-state slot of a just-created key (one rerun)
USAGE_RANGES_S = {"Last hour": 3600, "Last 24 hours": 86400, "Last 7 days": 7 * 86400, "Last 30 days": 30 * 86400}


def create_tenant_form(writable: bool) -> None:
    with st.expander("New tenant", expanded=False):
        with st.form("create_tenant", clear_on_submit=True):
            name = st.text_input("Name", key="new_tenant_name", disabled=not writable)
            submitted = st.form_submit_button(
                "Create tenant", disabled=not writable, help=None if writable else READ_ONLY_HELP
            )
        if submitted:
            if not name.strip():
                st.error("A tenant needs a name.")
            elif (created := fetch(session.client().create_tenant, name.strip())) is not None:
                st.success(f"Created tenant {created.get('name')} ({created.get('id')}).")


def keys_tab(tenant: JSON, writable: bool) -> None:
    client = session.client()
    tid = str(tenant["id"])
    keys = fetch(client.keys, tid)
    if keys is None:
        return
    st.dataframe(
        [
            {
                "id": k.get("id"),
                "name": k.get("name"),
                "prefix": k.get("prefix"),
                "created (UTC)": fmt_time(k.get("created_at")),
                "status": "revoked " + fmt_time(k.get("revoked_at")) if k.get("revoked_at") else "active",
            }
            for k in keys
        ],
        hide_index=True,
        width="stretch",
    )
    # A key created in the previous run: its secret is held for that one rerun
    # (so the table above already lists the key), shown once, then dropped.
    created = st.session_state.pop(NEW_KEY, None)
    if created is not None and created.get("tenant_id") == tid:
        st.warning("Copy this key now. It will not be shown again.")
        st.code(str(created.get("secret")), language=None)
        st.caption(f"Key id {created.get('id')}, prefix {created.get('prefix')}")
    c1, c2 = st.columns([3, 1], vertical_alignment="bottom")
    key_name = c1.text_input("New key name", key="new_key_name", disabled=not writable)
    if c2.button("Create key", key="create_key", disabled=not writable, help=None if writable else READ_ONLY_HELP):
        made = fetch(client.create_key, tid, key_name.strip() or None)
        if made is not None:
            st.session_state[NEW_KEY] = {**made, "tenant_id": tid}
            st.rerun()  # redraw the table with the new key
    active = [k for k in keys if not k.get("revoked_at")]
    if active:
        labels = {str(k["id"]): f"{k.get('prefix')}… {k.get('name') or ''} ({k['id']})" for k in active}
        key_id = st.selectbox(
            "Key to revoke", list(labels), format_func=labels.__getitem__, key="revoke_key_id", disabled=not writable
        )
        confirmed_action(
            "revoke_key",
            "Revoke key",
            prompt=f"Revoke key **{labels[key_id]}**? Clients using it are refused at once.",
            payload={"key_id": key_id},
            run=lambda p: client.revoke_key(tid, p["key_id"]),
        )


def policy_tab(tenant: JSON, writable: bool) -> None:
    client = session.client()
    tid = str(tenant["id"])
    current = fetch(client.policy, tid)
    if current is None:
        return
    with st.form(f"policy_{tid}"):
        st.caption("Empty = unlimited.")
        cols = st.columns(3)
        raw: dict[str, Any] = {}
        for i, (name, label) in enumerate(LIMIT_LABELS.items()):
            raw[name] = cols[i % 3].number_input(
                label,
                min_value=None,
                value=current.get(name),
                step=1,
                key=f"pol_{tid}_{name}",
                placeholder="unlimited",
                disabled=not writable,
            )
        raw["priority"] = cols[2].number_input(
            f"Priority (0 highest .. {MAX_PRIORITY})",
            min_value=0,
            max_value=MAX_PRIORITY,
            value=int(current.get("priority", 1)),
            step=1,
            key=f"pol_{tid}_priority",
            disabled=not writable,
        )
        models = current.get("allowed_models")
        raw["allowed_models"] = st.text_input(
            "Allowed models (comma-separated; empty = all)",
            value=", ".join(models or []),
            key=f"pol_{tid}_models",
            disabled=not writable,
        )
        raw["cache_isolation"] = st.checkbox(
            "Cache isolation (tenant-private KV cache)",
            value=bool(current.get("cache_isolation", True)),
            key=f"pol_{tid}_isolation",
            disabled=not writable,
        )
        saved = st.form_submit_button("Save policy", disabled=not writable, help=None if writable else READ_ONLY_HELP)
    if saved:
        policy, problems = validate_policy(raw)
        if problems:
            st.error("Policy not saved: " + "; ".join(f"{LIMIT_LABELS.get(k, k)} {v}" for k, v in problems.items()))
        elif fetch(client.set_policy, tid, policy) is not None:
            st.success("Policy saved.")


def usage_tab(tenant: JSON) -> None:
    span = USAGE_RANGES_S[st.selectbox("Range", list(USAGE_RANGES_S), index=1, key="usage_range")]
    items = fetch(session.client().usage, str(tenant["id"]), since=round(time.time() - span))
    if items is None:
        return
    totals = {
        k: sum(int(i.get(k, 0)) for i in items)
        for k in ("requests", "prompt_tokens", "cached_tokens", "completion_tokens")
    }
    cols = st.columns(4)
    for col, (k, v) in zip(cols, totals.items(), strict=False):
        col.metric(k.replace("_", " ").capitalize(), f"{v:,}")
    chart = charts.usage(items)
    if chart is None:
        st.info("No usage in this range.")
    else:
        st.altair_chart(chart, width="stretch")


def manage_tab(tenant: JSON, writable: bool) -> None:
    client = session.client()
    tid = str(tenant["id"])
    c1, c2 = st.columns([3, 1], vertical_alignment="bottom")
    name = c1.text_input("Name", value=str(tenant.get("name", "")), key=f"rename_{tid}", disabled=not writable)
    renamed = c2.button("Rename", key="rename_tenant", disabled=not writable or name.strip() == tenant.get("name"))
    if renamed and fetch(client.update_tenant, tid, {"name": name.strip()}) is not None:
        st.success("Renamed.")
        st.rerun()
    confirmed_action(
        "delete_tenant",
        "Delete tenant",
        prompt=f"Delete tenant **{tenant.get('name')}** with all its keys and its policy? Its usage history is kept.",
        payload={"tenant_id": tid},
        run=lambda p: client.delete_tenant(p["tenant_id"]),
    )


st.title("Tenants")
writable = session.can_write()
create_tenant_form(writable)
tenants = fetch(session.client().tenants)
if tenants is not None:
    if not tenants:
        st.info("No tenants yet.")
    else:
        st.dataframe(
            [
                {"id": t.get("id"), "name": t.get("name"), "created (UTC)": fmt_time(t.get("created_at"))}
                for t in tenants
            ],
            hide_index=True,
            width="stretch",
        )
        by_id = {str(t["id"]): t for t in tenants}
        tid = st.selectbox(
            "Tenant", list(by_id), key="tenant_id", format_func=lambda i: f"{by_id[i].get('name')} ({i})"
        )
        keys, policy, usage, manage = st.tabs(["API keys", "Policy", "Usage", "Manage"])
        with keys:
            keys_tab(by_id[tid], writable)
        with policy:
            policy_tab(by_id[tid], writable)
        with usage:
            usage_tab(by_id[tid])
        with manage:
            manage_tab(by_id[tid], writable)
