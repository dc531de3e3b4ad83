"""Combine scorers into a routing decision with conditional disaggregation."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.routing.scorers import NodeLoad, RouteRequest, free_kv, prefix_locality, queue_load


@dataclass(frozen=True)
class RouterConfig:
    # Uncached prompt tokens at or below this run the whole request on the
    # decode node (no separate prefill): the agent turn that appends a short
    # tool result to a cached context.
    local_prefill_max_tokens: int = 256
    prefill_weights: tuple[float, float] = (0.6, 0.4)  # (locality, load)
    decode_weights: tuple[float, float, float] = (0.2, 0.5, 0.3)  # (locality, load, free kv)
    load_scale: float = 4.0

    def __post_init__(self) -> None:
        if self.local_prefill_max_tokens < 0:
            raise ValueError("local_prefill_max_tokens must be >= 0")
        if self.load_scale <= 0:
            raise ValueError("load_scale must be > 0")


@dataclass(frozen=True)
class RouteDecision:
    decode_node: str
    prefill_node: str | None  # None: the decode node computes the prompt itself
    cached_tokens: int  # prefix tokens available to the computing node
    reason: str

    @property
    def disaggregated(self) -> bool:
        return self.prefill_node is not None


class NoNodeAvailable(Exception):
    """No healthy, non-draining node can take this request."""


def _eligible(nodes: list[NodeLoad], phase: str) -> list[NodeLoad]:
    return [n for n in nodes if n.phase == phase and n.healthy and not n.draining]


def _best(nodes: list[NodeLoad], score) -> NodeLoad:
    # Ties broken by node id so the choice is deterministic.
    return max(nodes, key=lambda n: (score(n), n.node_id))


def route(req: RouteRequest, nodes: list[NodeLoad], config: RouterConfig = RouterConfig()) -> RouteDecision:
    decoders = _eligible(nodes, "decode")
    prefillers = _eligible(nodes, "prefill")
    if not decoders:
        # A cluster that is all-prefill for a moment still serves: any healthy
        # node runs the whole request (no separate prefill: that would put
        # both halves on prefill-phase nodes, or on the same node twice).
        decoders = [n for n in nodes if n.healthy and not n.draining] or [n for n in nodes if n.healthy]
        prefillers = []
    if not decoders:
        raise NoNodeAvailable("no healthy worker")

    wl, wq, wk = config.decode_weights

    def decode_score(n: NodeLoad) -> float:
        return wl * prefix_locality(req, n) + wq * queue_load(n, config.load_scale) + wk * free_kv(n)

    decode = _best(decoders, decode_score)
    cached = max(req.pool_cached_tokens, req.cached_by_node.get(decode.node_id, 0))
    uncached = max(0, req.prompt_tokens - cached)
    if uncached <= config.local_prefill_max_tokens or not prefillers:
        why = "short uncached suffix" if prefillers else "no separate prefill node"
        return RouteDecision(decode.node_id, None, cached, f"local prefill: {why} ({uncached} tokens)")

    pl, pq = config.prefill_weights

    def prefill_score(n: NodeLoad) -> float:
        return pl * prefix_locality(req, n) + pq * queue_load(n, config.load_scale)

    prefill = _best(prefillers, prefill_score)
    return RouteDecision(decode.node_id, prefill.node_id, cached, f"disaggregated ({uncached} uncached tokens)")
