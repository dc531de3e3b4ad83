"""Cache page: the KV directory's size, hit rate and the branches holding most blocks."""

from __future__ import annotations

import streamlit as st

from admin_ui import charts, session
from admin_ui.widgets import fetch, fmt_bytes


def cache_view() -> None:
    cluster = fetch(session.client().cluster)
    if cluster is None:
        return
    directory = cluster.get("directory") or {}
    if directory.get("available") is False:
        st.warning("The KV directory is unreachable: the last numbers it gave; no request gets cache hits.")
    blocks = int(directory.get("blocks", 0))
    referenced = int(directory.get("referenced", 0))
    cols = st.columns(4)
    cols[0].metric("Blocks", f"{blocks:,}")
    cols[1].metric("Bytes", fmt_bytes(float(directory.get("bytes", 0))))
    cols[2].metric(
        "Referenced by active branches",
        f"{referenced:,}",
        f"{referenced / blocks:.0%} of blocks" if blocks else None,
        delta_color="off",
        delta_arrow="off",
    )
    cols[3].metric("Hit rate", f"{float(directory.get('hit_rate', 0.0)):.1%}")
    st.subheader("Branches holding the most blocks")
    branches = cluster.get("top_branches") or []
    chart = charts.top_branches(branches)
    if chart is None:
        st.info("No active branch holds cached blocks.")
        return
    st.altair_chart(chart, width="stretch")
    st.dataframe(branches, hide_index=True, width="stretch")


st.title("Cache")
st.fragment(cache_view, run_every=session.settings().refresh_s)()
