"""Short runs of `bench disagg` and `bench prefetch` on the session's two
real vLLM-CPU workers (wA prefill, wB decode; tests/integration/vllm_cluster.py).

The benchmark functions take worker URLs, so no extra engines start here;
each run restores the workers' phases.
"""

from __future__ import annotations

import pytest

from bench import disagg_bench, prefetch_bench
from bench._kvbench import phase_of

pytestmark = pytest.mark.vllm


def test_disagg_bench_short_run_is_identical(vllm_cluster):
    url_a, url_b = vllm_cluster.url("wA"), vllm_cluster.url("wB")
    r = disagg_bench.run_bench(
        url_a,
        url_b,
        prompt_tokens=330,
        output_tokens=24,
        migration_output_tokens=3700,
        migrate_after_tokens=30,
        seed=3,
        verify_after=256,
    )
    assert r["identical_tokens"], r
    assert r["migration_identical_tokens"], r
    assert r["decode_computed_prompt_tokens"] == 330 - 320  # 10 full blocks pulled; B computes the tail
    assert r["decode_computed_fraction"] <= 0.10
    assert r["migration_resumed_cached_tokens"] >= r["migration_resumed_context_tokens"] - 64
    assert r["targets_met"]
    assert (phase_of(url_a), phase_of(url_b)) == ("prefill", "decode")


def test_prefetch_bench_short_run_pulls_every_prefix(vllm_cluster):
    url_p, url_c = vllm_cluster.url("wA"), vllm_cluster.url("wB")
    workload = prefetch_bench.Workload(
        sessions=2,
        turns=2,
        base_tokens=(1200, 1600),
        tool_tokens=(40, 120),
        assistant_tokens=(16, 32),
        think_s=(0.01, 0.05),
        seed=5,
    )
    r = prefetch_bench.run_bench(url_p, url_c, workload)
    assert r["first_tokens_identical"], r
    for mode in ("async", "layerwise"):
        m = r[mode]
        assert m["requests"] == 4
        assert m["pull_hit_fraction"] == 1.0, m  # every turn loaded its whole prefix from the peer
        assert 0.0 <= m["gap_idle_fraction"] <= 1.0 and m["idle_fraction"] >= 0.0
        assert 0.0 < m["ttft_p50_s"] <= m["ttft_p95_s"]
    assert r["async"]["kv_wait_in_step_s"] == 0.0
    assert "idle_fraction_reduction" in r
    assert (phase_of(url_p), phase_of(url_c)) == ("prefill", "decode")
