"""The Cluster page's picture: one tile per node, coloured by phase.

Pure functions from the `/admin/cluster` body to an HTML string, so the
picture is tested with literal values. Draining nodes carry a striped
border and "→ phase"; unhealthy nodes are red; pinned nodes show a pin.
"""

from __future__ import annotations

from html import escape
from typing import Any

PHASE_COLOURS: dict[str, str] = {"prefill": "#2563eb", "decode": "#059669"}
DRAINING_COLOUR = "#d97706"
UNHEALTHY_COLOUR = "#dc2626"
UNKNOWN_COLOUR = "#6b7280"


def phase_colour(phase: str) -> str:
    return PHASE_COLOURS.get(phase, UNKNOWN_COLOUR)


def _bar(fraction: float, colour: str) -> str:
    pct = max(0.0, min(1.0, fraction)) * 100
    return (
        f'<div style="background:#e5e7eb;border-radius:3px;height:8px;width:100%;">'
        f'<div style="background:{colour};width:{pct:.0f}%;height:8px;border-radius:3px;"></div></div>'
    )


def node_tile(node: dict[str, Any]) -> str:
    node_id = escape(str(node.get("node_id", "?")))
    phase = str(node.get("phase", "?"))
    draining_to = node.get("draining_to")
    healthy = bool(node.get("healthy", True))
    colour = phase_colour(phase)
    border = f"4px solid {colour}"
    badges: list[str] = []
    if draining_to:
        border = f"4px dashed {DRAINING_COLOUR}"
        badges.append(
            f'<span style="background:{DRAINING_COLOUR};color:white;padding:1px 6px;'
            f'border-radius:8px;">draining → {escape(str(draining_to))}</span>'
        )
    if not healthy:
        border = f"4px solid {UNHEALTHY_COLOUR}"
        # engine_dead: the process answers but its engine core is gone (restarting)
        label = "engine dead" if node.get("health") == "engine_dead" else "unhealthy"
        badges.append(
            f'<span style="background:{UNHEALTHY_COLOUR};color:white;padding:1px 6px;border-radius:8px;">{label}</span>'
        )
    if node.get("pinned_phase"):
        badges.append(
            f'<span title="pinned" style="border:1px solid #374151;padding:0 6px;border-radius:8px;">'
            f"📌 {escape(str(node['pinned_phase']))}</span>"
        )
    kv = float(node.get("kv_usage", 0.0) or 0.0)
    kv_colour = UNHEALTHY_COLOUR if kv >= 0.9 else DRAINING_COLOUR if kv >= 0.7 else colour
    return (
        f'<div class="node-tile" data-node="{node_id}" data-phase="{escape(phase)}" '
        f'data-draining="{"yes" if draining_to else "no"}" '
        f'style="border:{border};border-radius:10px;padding:10px 12px;width:190px;'
        f'background:{colour}14;font-family:sans-serif;font-size:13px;color:#111827;">'
        f'<div style="display:flex;justify-content:space-between;align-items:center;">'
        f'<b style="font-size:15px;">{node_id}</b>'
        f'<span style="background:{colour};color:white;padding:1px 8px;border-radius:8px;">{escape(phase)}</span></div>'
        f'<div style="margin:4px 0;min-height:18px;display:flex;gap:4px;flex-wrap:wrap;font-size:11px;">'
        f"{''.join(badges)}</div>"
        f"<div>queue <b>{int(node.get('queue', 0))}</b> · running <b>{int(node.get('running', 0))}</b></div>"
        f'<div style="margin-top:4px;">KV {kv * 100:.0f}%</div>{_bar(kv, kv_colour)}'
        f'<div style="margin-top:4px;">{float(node.get("tokens_per_s", 0.0)):.1f} tok/s</div>'
        f"</div>"
    )


def split_bar(prefill: int, decode: int) -> str:
    total = max(1, prefill + decode)
    return (
        '<div style="display:flex;height:26px;border-radius:6px;overflow:hidden;font-family:sans-serif;'
        'font-size:13px;color:white;margin-bottom:10px;">'
        f'<div style="flex:{prefill / total:.4f};background:{PHASE_COLOURS["prefill"]};display:flex;'
        f'align-items:center;padding-left:8px;">{"prefill " + str(prefill) if prefill else ""}</div>'
        f'<div style="flex:{decode / total:.4f};background:{PHASE_COLOURS["decode"]};display:flex;'
        f'align-items:center;padding-left:8px;">{"decode " + str(decode) if decode else ""}</div></div>'
    )


def cluster_picture(cluster: dict[str, Any]) -> str:
    """Split bar, then prefill tiles before decode tiles (draining ones by their current phase)."""
    nodes = sorted(
        cluster.get("nodes", []), key=lambda n: (0 if n.get("phase") == "prefill" else 1, str(n.get("node_id")))
    )
    split = cluster.get("split") or [0, 0]
    tiles = "".join(node_tile(n) for n in nodes) or "<i>No nodes registered.</i>"
    return split_bar(int(split[0]), int(split[1])) + f'<div style="display:flex;flex-wrap:wrap;gap:12px;">{tiles}</div>'
