"""The Planner page's table of checked moves: predicted vs realized gain.

Pure: the `/admin/decisions?checked=true` items in, one row per checked
move out, so the table is tested with literal values. A decision that
checked a move carries it in its inputs (`planner.verification`): when the
move was made, from and to which split, whether it was a latency move,
and whether it delivered or was reverted.
"""

from __future__ import annotations

from typing import Any


def _pct(value: Any) -> str:
    return f"{100.0 * float(value):+.1f} %" if isinstance(value, (int, float)) else "—"


def move_check_rows(items: list[dict[str, Any]]) -> list[dict[str, str | float]]:
    """One row per decision that checked a move (newest first, as given)."""
    rows: list[dict[str, str | float]] = []
    for item in items:
        inputs = item.get("inputs") or {}
        if item.get("realized_gain") is None or "verified_move_t" not in inputs:
            continue
        delivered, reverted = inputs.get("move_delivered", 0.0) > 0, inputs.get("move_reverted", 0.0) > 0
        before, after = int(inputs.get("verified_from_prefill", 0)), int(inputs.get("verified_to_prefill", 0))
        rows.append(
            {
                "move at": float(inputs["verified_move_t"]),
                "move": f"{before}P -> {after}P",
                "kind": "latency" if inputs.get("verified_latency", 0.0) > 0 else "throughput",
                "predicted": _pct(item.get("predicted_gain")),
                "realized": _pct(item.get("realized_gain")),
                "verdict": "delivered" if delivered else ("reverted" if reverted else "short, kept"),
                "checked at": float(item.get("t", 0.0)),
            }
        )
    return rows
