"""History page: switch events and planner decisions, filtered, plotted, exported."""

from __future__ import annotations

import time
from typing import Any

import streamlit as st

from admin_ui import charts, session
from admin_ui.widgets import fetch, fmt_time

RANGES_S: dict[str, float | None] = {
    "Last hour": 3600,
    "Last 6 hours": 6 * 3600,
    "Last 24 hours": 86400,
    "Last 7 days": 7 * 86400,
    "Last 30 days": 30 * 86400,
    "All time": None,
}
ACTED = {"any": None, "acted": True, "not acted": False}
OUTCOMES = ["any", "ok", "failed", "noop"]
LIMIT = 500


def filters() -> tuple[dict[str, Any], dict[str, Any]]:
    """(switch filters, decision filters) as admin API query parameters."""
    cluster = fetch(session.client().cluster) or {}
    node_ids = ["all"] + sorted(str(n["node_id"]) for n in cluster.get("nodes", []))
    c1, c2, c3, c4, c5 = st.columns([1.3, 1, 1.3, 1, 1])
    span = RANGES_S[c1.selectbox("Time range", list(RANGES_S), index=2, key="hist_range")]
    node = c2.selectbox("Node", node_ids, key="hist_node")
    reason = c3.text_input("Reason contains", key="hist_reason")
    outcome = c4.selectbox("Outcome", OUTCOMES, key="hist_outcome")
    acted = ACTED[c5.selectbox("Decisions", list(ACTED), key="hist_acted")]
    since = None if span is None else round(time.time() - span, 3)
    switch_q = {
        "since": since,
        "node": None if node == "all" else node,
        "reason": reason.strip() or None,
        "outcome": None if outcome == "any" else outcome,
    }
    return switch_q, {"since": since, "acted": acted}


def switch_rows(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "time (UTC)": fmt_time(s.get("t")),
            "node": s.get("node_id"),
            "from": s.get("from_phase"),
            "to": s.get("to_phase"),
            "reason": s.get("reason"),
            "who": s.get("who"),
            "drain_s": s.get("drain_s"),
            "migrate_s": s.get("migrate_s"),
            "total_s": s.get("total_s"),
            "outcome": s.get("outcome"),
            "detail": s.get("detail"),
        }
        for s in items
    ]


def decision_rows(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for d in items:
        cur = d.get("current_split") or ["?", "?"]
        chosen = d.get("chosen_split") or ["?", "?"]
        rows.append(
            {
                "time (UTC)": fmt_time(d.get("t")),
                "planner": d.get("planner"),
                "mode": d.get("mode"),
                "current": f"{cur[0]}P/{cur[1]}D",
                "chosen": f"{chosen[0]}P/{chosen[1]}D",
                "acted": bool(d.get("acted")),
                "confidence": d.get("confidence"),
                "why": d.get("reason"),
            }
        )
    return rows


st.title("History")
switch_q, decision_q = filters()
client = session.client()
switches = fetch(client.switches, **switch_q, limit=LIMIT)
decisions = fetch(client.decisions, **decision_q, limit=LIMIT)
switch_items, switch_total = switches or ([], 0)
decision_items, decision_total = decisions or ([], 0)

chart = charts.timeline(switch_items, decision_items)
if chart is None:
    st.info("No switch or decision in this range.")
else:
    st.altair_chart(chart, width="stretch")

switch_tab, decision_tab, audit_tab = st.tabs(
    [f"Switch events ({switch_total})", f"Planner decisions ({decision_total})", "Admin audit log"]
)
with switch_tab:
    if switch_total > len(switch_items):
        st.caption(f"Showing the newest {len(switch_items)} of {switch_total}; the CSV has them all.")
    st.dataframe(switch_rows(switch_items), hide_index=True, width="stretch")
    csv = fetch(client.switches_csv, **switch_q) if switches is not None else None
    if csv is not None:
        st.download_button(
            "Download switch events (CSV)",
            csv,
            file_name="switch-events.csv",
            mime="text/csv",
            key="dl_switches",
            on_click="ignore",
        )
with decision_tab:
    if decision_total > len(decision_items):
        st.caption(f"Showing the newest {len(decision_items)} of {decision_total}; the CSV has them all.")
    st.dataframe(decision_rows(decision_items), hide_index=True, width="stretch")
    csv = fetch(client.decisions_csv, **decision_q) if decisions is not None else None
    if csv is not None:
        st.download_button(
            "Download planner decisions (CSV)",
            csv,
            file_name="planner-decisions.csv",
            mime="text/csv",
            key="dl_decisions",
            on_click="ignore",
        )
with audit_tab:
    audit = fetch(client.audit, limit=200) or []
    st.dataframe(
        [
            {
                "time (UTC)": fmt_time(a.get("t")),
                "actor": a.get("actor"),
                "actor token": a.get("actor_id"),
                "action": a.get("action"),
                "target": a.get("target"),
                "after": str(a.get("after", "")),
            }
            for a in audit
        ],
        hide_index=True,
        width="stretch",
    )
