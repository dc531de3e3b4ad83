"""The estimator plans with the engine limits nodes report, else its defaults."""

from __future__ import annotations

from core import Phase
from planner.engine_limits import with_engine_limits
from planner.estimator_config import EstimatorConfig
from planner.types import NodeState


def test_reported_limits_replace_the_defaults_the_smallest_wins() -> None:
    base = EstimatorConfig()
    nodes = [
        NodeState("a", Phase.PREFILL, max_batch=64, token_budget=2048),
        NodeState("b", Phase.DECODE, max_batch=128, token_budget=4096),
        NodeState("c", Phase.DECODE),  # reports nothing
    ]
    cfg = with_engine_limits(base, nodes)
    assert (cfg.prefill_token_budget, cfg.max_decode_batch, cfg.max_prefill_batch) == (2048, 64, 64)
    assert (cfg.z, cfg.switch_to_prefill_s) == (base.z, base.switch_to_prefill_s)


def test_nothing_reported_keeps_the_config() -> None:
    base = EstimatorConfig(prefill_token_budget=1000)
    assert with_engine_limits(base, [NodeState("a", Phase.DECODE)]) is base
    assert with_engine_limits(base, []) is base
