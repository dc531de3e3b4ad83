"""Altair charts built from admin API bodies (pure: data in, chart out).

Times are shown as the tables show them: 24-hour clock, UTC, whatever the
browser's time zone (a UTC scale and UTC time units; Vega-Lite's default
is the browser's local time on a 12-hour clock).
"""

from __future__ import annotations

from typing import Any

import altair as alt
import pandas as pd

from admin_ui.tiles import PHASE_COLOURS
from admin_ui.widgets import to_datetime

_PHASE_SCALE = alt.Scale(domain=["prefill", "decode"], range=[PHASE_COLOURS["prefill"], PHASE_COLOURS["decode"]])
CLOCK = "%H:%M"  # axis labels within a day
DATE_CLOCK = "%m-%d %H:%M"  # axis labels over days
STAMP = "%Y-%m-%d %H:%M:%S"  # tooltips, as in the tables


def utc_x(field: str = "time", *, labels: str = DATE_CLOCK) -> alt.X:
    """A time axis in UTC, 24-hour labels."""
    return alt.X(f"{field}:T", title="UTC", scale=alt.Scale(type="utc"), axis=alt.Axis(format=labels, labelAngle=0))


def utc_tooltip(field: str = "time") -> alt.Tooltip:
    return alt.Tooltip(f"utcyearmonthdatehoursminutesseconds({field}):T", title="time (UTC)", format=STAMP)


def split_history(items: list[dict[str, Any]]) -> alt.LayerChart | None:
    """Stacked prefill/decode node counts with cluster tokens/s on a second axis."""
    if not items:
        return None
    frame = pd.DataFrame(
        {
            "time": [to_datetime(i.get("t")) for i in items],
            "prefill": [int(i.get("prefill", 0)) for i in items],
            "decode": [int(i.get("decode", 0)) for i in items],
            "tokens_per_s": [float(i.get("tokens_per_s", 0.0)) for i in items],
        }
    )
    nodes = frame.melt(id_vars=["time"], value_vars=["prefill", "decode"], var_name="phase", value_name="nodes")
    area = (
        alt.Chart(nodes)
        .mark_area(opacity=0.55, interpolate="step-after")
        .encode(
            x=utc_x(labels=CLOCK),
            y=alt.Y("nodes:Q", stack=True, title="nodes"),
            color=alt.Color("phase:N", scale=_PHASE_SCALE, title="phase"),
            order=alt.Order("phase:N", sort="descending"),
            tooltip=[utc_tooltip(), "phase:N", "nodes:Q"],
        )
    )
    line = (
        alt.Chart(frame)
        .mark_line(color="#111827", strokeWidth=2)
        .encode(
            x=utc_x(labels=CLOCK),
            y=alt.Y("tokens_per_s:Q", title="tokens/s"),
            tooltip=[utc_tooltip(), alt.Tooltip("tokens_per_s:Q", format=".1f")],
        )
    )
    return alt.layer(area, line).resolve_scale(y="independent").properties(height=260)


def predictions(preds: list[dict[str, Any]], current_prefill: int | None) -> alt.LayerChart | alt.FacetChart | None:
    """Predicted throughput per split with its confidence band; the live split outlined."""
    if not preds:
        return None
    rows = []
    for p in preds:
        prefill, decode = int(p.get("prefill_nodes", 0)), int(p.get("decode_nodes", 0))
        mid = float(p.get("throughput_rps", 0.0))
        rows.append(
            {
                "split": f"{prefill}P/{decode}D",
                "prefill": prefill,
                "throughput": mid,
                "lo": float(p.get("throughput_lo_rps", mid)),
                "hi": float(p.get("throughput_hi_rps", mid)),
                "ttft_s": p.get("ttft_s"),
                "tpot_s": p.get("tpot_s"),
                "feasible": "meets SLOs" if p.get("feasible", True) else "misses SLOs",
                "current": "current" if prefill == current_prefill else "",
            }
        )
    frame = pd.DataFrame(rows).sort_values("prefill")
    order = list(frame["split"])
    x = alt.X("split:N", sort=order, title="split (prefill/decode)", axis=alt.Axis(labelAngle=0))
    band = (
        alt.Chart(frame)
        .mark_bar(opacity=0.3, size=28)
        .encode(
            x=x,
            y=alt.Y("lo:Q", title="throughput (req/s)"),
            y2="hi:Q",
            color=alt.Color(
                "feasible:N",
                scale=alt.Scale(domain=["meets SLOs", "misses SLOs"], range=["#2563eb", "#9ca3af"]),
                title=None,
            ),
        )
    )
    point = (
        alt.Chart(frame)
        .mark_point(filled=True, size=90)
        .encode(
            x=x,
            y="throughput:Q",
            color=alt.Color("feasible:N", legend=None),
            tooltip=[
                "split",
                alt.Tooltip("throughput:Q", format=".2f"),
                alt.Tooltip("lo:Q", format=".2f"),
                alt.Tooltip("hi:Q", format=".2f"),
                "ttft_s",
                "tpot_s",
                "feasible",
            ],
        )
    )
    current = (
        alt.Chart(frame[frame["current"] == "current"])
        .mark_point(shape="diamond", size=380, strokeWidth=2, color="#dc2626", filled=False)
        .encode(x=x, y="throughput:Q")
    )
    return alt.layer(band, point, current).properties(height=280)


def timeline(switches: list[dict[str, Any]], decisions: list[dict[str, Any]]) -> alt.VConcatChart | None:
    """Switches per node (colour: target phase, shape: outcome) above planner decisions."""
    charts: list[alt.Chart] = []
    if switches:
        frame = pd.DataFrame(
            [
                {
                    "time": to_datetime(s.get("t") or s.get("at") or s.get("started_at")),
                    "node": str(s.get("node_id", "?")),
                    "to_phase": str(s.get("to_phase", "?")),
                    "outcome": str(s.get("outcome", "?")),
                    "reason": str(s.get("reason", "")),
                    "total_s": s.get("total_s"),
                }
                for s in switches
            ]
        )
        charts.append(
            alt.Chart(frame)
            .mark_point(filled=True, size=110)
            .encode(
                x=utc_x(),
                y=alt.Y("node:N", title="switches"),
                color=alt.Color("to_phase:N", scale=_PHASE_SCALE, title="to phase"),
                shape=alt.Shape("outcome:N", title="outcome"),
                tooltip=[utc_tooltip(), "node", "to_phase", "outcome", "reason", "total_s"],
            )
            .properties(height=max(90, 30 * frame["node"].nunique()))
        )
    if decisions:
        frame = pd.DataFrame(
            [
                {
                    "time": to_datetime(d.get("t") or d.get("at") or d.get("created_at")),
                    "acted": "acted" if d.get("acted") else "not acted",
                    "why": str(d.get("reason") or d.get("why") or ""),
                    "chosen": _split_text(d.get("chosen_split")),
                }
                for d in decisions
            ]
        )
        charts.append(
            alt.Chart(frame)
            .mark_tick(thickness=3, size=30)
            .encode(
                x=utc_x(),
                y=alt.Y("acted:N", title="decisions"),
                color=alt.Color(
                    "acted:N",
                    scale=alt.Scale(domain=["acted", "not acted"], range=["#dc2626", "#9ca3af"]),
                    title="decision",
                ),
                tooltip=[utc_tooltip(), "acted", "chosen", "why"],
            )
            .properties(height=80)
        )
    if not charts:
        return None
    return alt.vconcat(*charts).resolve_scale(x="shared", color="independent", shape="independent")


def _split_text(split: Any) -> str:
    return f"{split[0]}P/{split[1]}D" if isinstance(split, (list, tuple)) and len(split) == 2 else "?"


def usage(items: list[dict[str, Any]]) -> alt.Chart | None:
    """Tokens per period, stacked by kind (prompt uncached / cached / completion)."""
    if not items:
        return None
    rows = []
    for i in items:
        when = to_datetime(i.get("minute") or i.get("t"))
        prompt, cached = int(i.get("prompt_tokens", 0)), int(i.get("cached_tokens", 0))
        rows += [
            {"time": when, "kind": "prompt (uncached)", "tokens": max(0, prompt - cached)},
            {"time": when, "kind": "prompt (cached)", "tokens": cached},
            {"time": when, "kind": "completion", "tokens": int(i.get("completion_tokens", 0))},
        ]
    return (
        alt.Chart(pd.DataFrame(rows))
        .mark_bar()
        .encode(
            x=utc_x(),
            y=alt.Y("tokens:Q", stack=True),
            color=alt.Color(
                "kind:N",
                title=None,
                scale=alt.Scale(
                    domain=["prompt (uncached)", "prompt (cached)", "completion"],
                    range=["#2563eb", "#93c5fd", "#059669"],
                ),
            ),
            tooltip=[utc_tooltip(), "kind", "tokens"],
        )
        .properties(height=240)
    )


def top_branches(branches: list[dict[str, Any]]) -> alt.Chart | None:
    if not branches:
        return None
    frame = pd.DataFrame(
        [
            {"branch": str(b.get("branch_id")), "tenant": str(b.get("tenant_id")), "blocks": int(b.get("blocks", 0))}
            for b in branches
        ]
    )
    return (
        alt.Chart(frame)
        .mark_bar()
        .encode(
            x=alt.X("blocks:Q", title="blocks held"),
            y=alt.Y("branch:N", sort="-x", title=None),
            color=alt.Color("tenant:N", title="tenant"),
            tooltip=["branch", "tenant", "blocks"],
        )
        .properties(height=alt.Step(24))
    )
