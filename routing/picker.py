"""Combine scorers into a routing decision with conditional disaggregation.

Filters (bounded-load locality), then the survivors are scored:
`within_load_slack`, prefill nodes whose queue + running is at most the
least loaded one's + `RouterConfig.prefill_load_slack`;
`within_queue_slack`, decode nodes whose waiting requests are at most the
least waiting one's + `RouterConfig.decode_queue_slack`.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.phase import Phase
from routing.scorers import NodeLoad, RouteRequest, free_kv, prefix_locality, queue_load


@dataclass(frozen=True)
class RouterConfig:
    # Uncached prompt tokens at or below this run the whole request on the
    # decode node (no separate prefill): the agent turn that appends a short
    # tool result to a cached context.
    local_prefill_max_tokens: int = 256
    prefill_weights: tuple[float, float] = (0.6, 0.4)  # (locality, load)
    # Bounded-load locality for prefill: only prefill nodes whose queue +
    # running is within this many of the least loaded one are scored. Any
    # prefill node can pull a cached prefix from the pool, so locality saves
    # a transfer, not the prefill; without a bound, the nodes that first
    # cached a shared system prompt outscore an idle node however long their
    # queue grows (the simulator's fixed-4p5d left 2 of 4 prefill nodes idle
    # all run). None: no bound.
    prefill_load_slack: int | None = 2
    decode_weights: tuple[float, float, float] = (0.2, 0.5, 0.3)  # (locality, load, free kv)
    # Bounded-queue locality for decode: only decode nodes with at most this
    # many more waiting requests than the least waiting one are scored. A
    # request waits on a decode node only behind a full batch or full KV, and
    # what locality saves there is one KV pull from the pool; the load score
    # cannot say it, being flat across batches of hundreds. Without a bound,
    # an agent session stays on the node holding its context however long
    # that node's queue grows: OpenCode at 3x load in the simulator (3P6D)
    # had 2,002 requests waiting on one decode node while the other five ran
    # 154-256 each with none waiting. None: no bound.
    decode_queue_slack: int | None = 2
    load_scale: float = 4.0

    def __post_init__(self) -> None:
        if self.local_prefill_max_tokens < 0:
            raise ValueError("local_prefill_max_tokens must be >= 0")
        if self.load_scale <= 0:
            raise ValueError("load_scale must be > 0")
        if self.prefill_load_slack is not None and self.prefill_load_slack < 0:
            raise ValueError("prefill_load_slack must be >= 0 or None")
        if self.decode_queue_slack is not None and self.decode_queue_slack < 0:
            raise ValueError("decode_queue_slack must be >= 0 or None")


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


def _eligible(nodes: list[NodeLoad]) -> tuple[list[NodeLoad], list[NodeLoad]]:
    """Healthy, non-draining (prefill, decode) nodes."""
    prefillers: list[NodeLoad] = []
    decoders: list[NodeLoad] = []
    for n in nodes:
        if n.healthy and not n.draining:
            if n.phase == Phase.PREFILL:
                prefillers.append(n)
            elif n.phase == Phase.DECODE:
                decoders.append(n)
    return prefillers, decoders


def within_load_slack(nodes: list[NodeLoad], slack: int | None) -> list[NodeLoad]:
    """Filter: nodes whose queue + running is at most the least loaded one's + slack."""
    if slack is None or len(nodes) < 2:
        return nodes
    bound = min(n.queue + n.running for n in nodes) + slack
    return [n for n in nodes if n.queue + n.running <= bound]


def within_queue_slack(nodes: list[NodeLoad], slack: int | None) -> list[NodeLoad]:
    """Filter: nodes whose waiting requests are at most the least waiting one's + slack."""
    if slack is None or len(nodes) < 2:
        return nodes
    bound = min(n.queue for n in nodes) + slack
    return [n for n in nodes if n.queue <= bound]


def _best(nodes: list[NodeLoad], scores: list[float]) -> NodeLoad:
    # Highest score; ties broken by the larger node id so the choice is deterministic.
    best, top = nodes[0], scores[0]
    for n, s in zip(nodes, scores, strict=False):
        if s > top or (s == top and n.node_id > best.node_id):
            best, top = n, s
    return best


def pick_decode(req: RouteRequest, decoders: list[NodeLoad], config: RouterConfig = RouterConfig()) -> NodeLoad:
    """The decode node among `decoders` (non-empty): locality, load and free KV."""
    wl, wq, wk = config.decode_weights
    scale = config.load_scale
    decoders = within_queue_slack(decoders, config.decode_queue_slack)
    return _best(
        decoders, [wl * prefix_locality(req, n) + wq * queue_load(n, scale) + wk * free_kv(n) for n in decoders]
    )


def route(req: RouteRequest, nodes: list[NodeLoad], config: RouterConfig = RouterConfig()) -> RouteDecision:
    prefillers, decoders = _eligible(nodes)
    if not decoders:
        # A cluster that is all-prefill for a moment still serves: any healthy
        # node runs the whole request (no separate prefill: that would put
        # both halves on prefill-phase nodes, or on the same node twice).
        decoders = [n for n in nodes if n.healthy and not n.draining] or [n for n in nodes if n.healthy]
        prefillers = []
    if not decoders:
        raise NoNodeAvailable("no healthy worker")

    decode = pick_decode(req, decoders, config)
    scale = config.load_scale
    cached = max(req.pool_cached_tokens, req.cached_by_node.get(decode.node_id, 0))
    uncached = max(0, req.prompt_tokens - cached)
    if uncached <= config.local_prefill_max_tokens or not prefillers:
        why = "short uncached suffix" if prefillers else "no separate prefill node"
        return RouteDecision(decode.node_id, None, cached, f"local prefill: {why} ({uncached} tokens)")

    pl, pq = config.prefill_weights
    prefillers = within_load_slack(prefillers, config.prefill_load_slack)
    prefill = _best(prefillers, [pl * prefix_locality(req, n) + pq * queue_load(n, scale) for n in prefillers])
    return RouteDecision(decode.node_id, prefill.node_id, cached, f"disaggregated ({uncached} uncached tokens)")
