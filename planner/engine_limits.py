"""The estimator's engine limits, from what the nodes say about themselves.

`EstimatorConfig`'s token budget and batch limits are defaults for engines
nobody told the planner about; a node that reports its own (vLLM's
`max_num_batched_tokens` and `max_num_seqs`, through `NodeState`) is
planned with those instead. Several nodes: the smallest reported value (a
split must hold on any node the router may pick). Pure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from planner.estimator_config import EstimatorConfig
from planner.types import NodeState


def with_engine_limits(config: EstimatorConfig, nodes: Iterable[NodeState]) -> EstimatorConfig:
    """`config` with the reported limits of `nodes` (0 = not reported: the default stays)."""
    nodes = list(nodes)
    budgets = [n.token_budget for n in nodes if n.token_budget > 0]
    batches = [n.max_batch for n in nodes if n.max_batch > 0]
    changes: dict[str, int] = {}
    if budgets:
        changes["prefill_token_budget"] = min(budgets)
    if batches:
        changes["max_decode_batch"] = min(batches)
        changes["max_prefill_batch"] = min(batches)
    return dataclasses.replace(config, **changes) if changes else config
