"""Cluster page: the live P/D split as a picture, and the last hour."""

from __future__ import annotations

import streamlit as st

from admin_ui import charts, session, tiles
from admin_ui.widgets import fetch


def live_view() -> None:
    client = session.client()
    cluster = fetch(client.cluster)
    if cluster is None:
        return
    nodes = cluster.get("nodes", [])
    prefill, decode = (cluster.get("split") or [0, 0])[:2]
    pin = cluster.get("split_pin")
    cols = st.columns(5)
    cols[0].metric("Nodes", len(nodes))
    cols[1].metric("Split (P/D)", f"{prefill} / {decode}")
    cols[2].metric("Split pin", "none" if pin is None else f"{pin}P")
    cols[3].metric("Draining", sum(1 for n in nodes if n.get("draining_to")))
    cols[4].metric("Tokens/s", f"{sum(float(n.get('tokens_per_s', 0.0)) for n in nodes):.1f}")
    st.html(tiles.cluster_picture(cluster))
    st.subheader("Split and throughput, last hour")
    history = fetch(client.cluster_history, 60)
    chart = charts.split_history(history or [])
    if chart is None:
        st.info("No split history yet.")
    else:
        st.altair_chart(chart, width="stretch")


st.title("Cluster")
auto = st.toggle(
    "Auto-refresh", value=True, key="cluster_auto_refresh", help=f"Reload every {session.settings().refresh_s:g} s"
)
st.fragment(live_view, run_every=session.settings().refresh_s if auto else None)()
