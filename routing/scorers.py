"""Routing scorers. Each maps (request, node) to a score in [0, 1]; higher is
better. Pure functions over plain numbers (llm-d style), tested with literals.

Formulas:
- prefix_locality = cached_tokens_on_node / prompt_tokens
- queue_load      = 1 / (1 + (queue + running) / load_scale)
- free_kv         = 1 - kv_usage
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from core.phase import Phase


class NodeLoad(NamedTuple):
    """One node as the router sees it (a plain record: the simulator builds
    tens of thousands per simulated second)."""

    node_id: str
    phase: Phase
    queue: int = 0
    running: int = 0
    kv_usage: float = 0.0  # 0..1
    draining: bool = False
    healthy: bool = True


@dataclass(frozen=True)
class RouteRequest:
    prompt_tokens: int
    # prefix tokens whose KV each node already holds (device cache or its own
    # host store); a node absent from the map holds none.
    cached_by_node: dict[str, int] = field(default_factory=dict)
    # longest prefix held anywhere in the pool (pullable by any node).
    pool_cached_tokens: int = 0


def prefix_locality(req: RouteRequest, node: NodeLoad) -> float:
    if req.prompt_tokens <= 0:
        return 0.0
    return min(1.0, req.cached_by_node.get(node.node_id, 0) / req.prompt_tokens)


def queue_load(node: NodeLoad, load_scale: float = 4.0) -> float:
    return 1.0 / (1.0 + (node.queue + node.running) / load_scale)


def free_kv(node: NodeLoad) -> float:
    return max(0.0, min(1.0, 1.0 - node.kv_usage))
