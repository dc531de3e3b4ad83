"""Planner page: mode, the latest prediction per split, checked moves, pins and manual switches.

Every write goes through `confirmed_action`: the operator sees what will be
done, confirms, and the call's result stays on screen.
"""

from __future__ import annotations

import time
from typing import Any

import streamlit as st

from admin_ui import charts, session
from admin_ui.client import JSON
from admin_ui.move_checks import move_check_rows
from admin_ui.widgets import confirmed_action, fetch, fmt_time, leadership_line, prediction_status

MODES = ["auto", "advisory", "manual"]
PHASES = ["prefill", "decode"]
MODE_HELP = {
    "auto": "the planner switches nodes itself",
    "advisory": "the planner records what it would do, switches nothing",
    "manual": "the planner only predicts, stores no decision and switches nothing; operators switch nodes",
}


def mode_section(state: JSON) -> None:
    client = session.client()
    current = str(state.get("mode", "?"))
    st.subheader("Mode")
    st.markdown(f"Current mode: **{current}** — {MODE_HELP.get(current, '')}. Planner: `{state.get('planner', '?')}`")
    if line := leadership_line(state.get("leadership")):
        st.caption(line)
    choice = st.radio(
        "New mode",
        MODES,
        index=MODES.index(current) if current in MODES else 0,
        horizontal=True,
        key="planner_mode_choice",
        disabled=not session.can_write(),
        format_func=lambda m: f"{m} ({MODE_HELP[m]})",
    )
    confirmed_action(
        "set_mode",
        "Set mode",
        prompt=f"Switch the planner from **{current}** to **{choice}**?",
        payload={"mode": choice},
        run=lambda p: client.set_mode(p["mode"]),
        disabled=choice == current,
    )


def predictions_section(state: JSON, split: list[int]) -> None:
    st.subheader("Latest prediction per split")
    preds: list[dict[str, Any]] = state.get("predictions") or []
    decision = state.get("last_decision")
    status = prediction_status(state.get("predictions_t"), decision, time.time())
    chart = charts.predictions(preds, split[0] if split else None)
    if chart is None:
        st.info(status)
    else:
        st.caption(
            status + " Bars: confidence band of predicted throughput; dot: estimate; "
            "red diamond: the live split; grey: misses the TTFT/TPOT SLOs."
        )
        st.altair_chart(chart, width="stretch")
        with st.expander("Prediction table"):
            st.dataframe(preds, hide_index=True, width="stretch")
    if decision:
        st.markdown(
            f"Last decision, {fmt_time(decision.get('t'))} UTC: **{decision.get('reason')}** "
            f"({'acted' if decision.get('acted') else 'not acted'})"
        )
    with st.expander("Last decision", expanded=False):
        if decision:
            st.json(decision)
        else:
            st.write("No decision recorded yet.")


def checks_section() -> None:
    st.subheader("Moves checked")
    found = fetch(session.client().decisions, checked=True, limit=50)
    rows = move_check_rows(found[0]) if found is not None else []
    if not rows:
        st.info("No model move has been checked yet (a move is checked a minute after its switch settles).")
        return
    for row in rows:
        row["move at"], row["checked at"] = fmt_time(row["move at"]), fmt_time(row["checked at"])
    st.caption(
        "Each model move, once settled, is compared with what the planner predicted for it: finish rate "
        "(throughput moves) or mean response time (latency moves) over a minute against the minute before. "
        "A move that fell outside the model's uncertainty and gained nothing measurable is reverted."
    )
    st.dataframe(rows, hide_index=True, use_container_width=True)


def pin_section(cluster: JSON) -> None:
    client = session.client()
    nodes: list[dict[str, Any]] = cluster.get("nodes", [])
    node_ids = [str(n["node_id"]) for n in nodes]
    pinned_nodes = {str(n["node_id"]): str(n["pinned_phase"]) for n in nodes if n.get("pinned_phase")}
    split_pin = cluster.get("split_pin")
    writable = session.can_write()
    st.subheader("Pins and overrides")
    pins_text = ", ".join(f"`{k}` → {v}" for k, v in pinned_nodes.items()) or "none"
    st.markdown(
        f"Split pin: **{'none' if split_pin is None else f'{split_pin} prefill nodes'}** · Node pins: {pins_text}"
    )
    split_tab, node_tab, switch_tab = st.tabs(["Pin the split", "Pin a node", "Manual switch"])
    with split_tab:
        total = len(nodes)
        current = int(split_pin if split_pin is not None else (cluster.get("split") or [0])[0])
        prefill = int(
            st.number_input(
                "Prefill nodes",
                min_value=0,
                max_value=max(total, 0),
                value=min(current, total),
                step=1,
                key="pin_split_prefill",
                disabled=not writable,
            )
        )
        confirmed_action(
            "pin_split",
            "Pin split",
            prompt=f"Pin the split to **{prefill} prefill / {total - prefill} decode** nodes? "
            "Nodes will switch phase to reach it, and the planner will not move it.",
            payload={"prefill_nodes": prefill},
            run=lambda p: client.pin_split(p["prefill_nodes"]),
        )
        confirmed_action(
            "unpin_split",
            "Unpin split",
            prompt="Remove the split pin? The planner decides the split again.",
            payload={},
            run=lambda p: client.unpin_split(),
            disabled=split_pin is None,
        )
    with node_tab:
        if not node_ids:
            st.info("No nodes registered.")
        else:
            node = st.selectbox("Node", node_ids, key="pin_node_id", disabled=not writable)
            phase = st.radio("Phase", PHASES, horizontal=True, key="pin_node_phase", disabled=not writable)
            confirmed_action(
                "pin_node",
                "Pin node",
                prompt=f"Pin `{node}` to **{phase}**? It switches now if needed.",
                payload={"node_id": node, "phase": phase},
                run=lambda p: client.pin_node(p["node_id"], p["phase"]),
            )
            unpin = st.selectbox("Pinned node", list(pinned_nodes) or ["—"], key="unpin_node_id", disabled=not writable)
            confirmed_action(
                "unpin_node",
                "Unpin node",
                prompt=f"Remove the pin on `{unpin}`?",
                payload={"node_id": unpin},
                run=lambda p: client.unpin_node(p["node_id"]),
                disabled=not pinned_nodes,
            )
    with switch_tab:
        if not node_ids:
            st.info("No nodes registered.")
            return
        node = st.selectbox("Node", node_ids, key="switch_node_id", disabled=not writable)
        phase_now = next((str(n.get("phase")) for n in nodes if str(n["node_id"]) == node), "prefill")
        target = "decode" if phase_now == "prefill" else "prefill"
        st.markdown(
            f"`{node}` is **{phase_now}**; the switch moves it to **{target}** "
            "(in place: drain, migrate in-flight decodes, flip)."
        )
        reason = st.text_input("Reason (recorded)", value="manual", key="switch_reason", disabled=not writable)
        confirmed_action(
            "manual_switch",
            "Switch node",
            prompt=f"Switch `{node}` from **{phase_now}** to **{target}** now? Reason: {reason!r}",
            payload={"node_id": node, "to_phase": target, "reason": reason or "manual"},
            run=lambda p: client.switch(p["node_id"], p["to_phase"], p["reason"]),
        )


st.title("Planner")
state = fetch(session.client().planner)
cluster = fetch(session.client().cluster)
if state is not None:
    mode_section(state)
if state is not None and cluster is not None:
    split = list(cluster.get("split") or [])
    st.caption(
        f"Live split: {split[0] if split else '?'}P / {split[1] if len(split) > 1 else '?'}D · "
        f"as of {fmt_time(time.time())} UTC"
    )
    predictions_section(state, split)
    checks_section()
if cluster is not None:
    pin_section(cluster)
