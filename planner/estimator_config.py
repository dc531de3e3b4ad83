"""The split estimator's settings (`planner.estimator`, `planner._split_math`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EstimatorConfig:
    """prefill_token_budget: tokens per prefill iteration (vLLM
        max_num_batched_tokens), ≥ 1.
    max_prefill_batch / max_decode_batch: requests per iteration (≥ 1).
    kv_usable_fraction: share of a decode node's KV the scheduler may fill, (0, 1]:
        1 - vLLM's scheduler `watermark` (0 by default: it admits until its
        blocks run out); a margin here makes the planner keep too many prefill
        nodes (docs/benchmarks-sim.md, fix 4).
    kv_output_reserved: fraction of a request's output its KV holds while it
        decodes, on average, in [0, 1]: 0.5 where the engine allocates KV as
        tokens are generated (vLLM), 1 where admission reserves the whole
        output (the simulator's decode engine). With the prompt it sets how
        many requests fit in a decode node's KV.
    z: standard normal quantile of the confidence bounds (1.645 = one-sided 95 %).
    switch_to_prefill_s / switch_to_decode_s: seconds a node is out of
        service while it switches in place (drain + migrate), ≥ 0.
    """

    prefill_token_budget: int = 8192
    max_prefill_batch: int = 256
    max_decode_batch: int = 256
    kv_usable_fraction: float = 1.0
    kv_output_reserved: float = 0.5
    z: float = 1.645
    switch_to_prefill_s: float = 6.2
    switch_to_decode_s: float = 6.2

    def __post_init__(self) -> None:
        if min(self.prefill_token_budget, self.max_prefill_batch, self.max_decode_batch) < 1:
            raise ValueError("token budget and batch limits must be >= 1")
        if not 0 < self.kv_usable_fraction <= 1:
            raise ValueError("kv_usable_fraction must be in (0, 1]")
        if not 0 <= self.kv_output_reserved <= 1:
            raise ValueError("kv_output_reserved must be in [0, 1]")
        if self.z < 0 or self.switch_to_prefill_s < 0 or self.switch_to_decode_s < 0:
            raise ValueError("z and switch times must be >= 0")
