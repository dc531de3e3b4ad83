"""Pure metrics of `bench prefetch`: interval arithmetic, idle fractions, the step model."""

from __future__ import annotations

import pytest

from bench._kvbench import percentile
from bench.prefetch_bench import Workload, excess_step_s, fit_step_model, measure, merge, overlap, summarize


def test_merge_and_measure_union_of_intervals():
    assert merge([(3, 4), (0, 1), (0.5, 2), (5, 5)]) == [(0, 2), (3, 4)]
    assert measure([(0, 1), (0.5, 2), (3, 4)]) == 3


def test_overlap_of_two_unions():
    assert overlap([(0, 10)], [(1, 2), (1.5, 3), (8, 12)]) == pytest.approx(4.0)
    assert overlap([(0, 1)], [(2, 3)]) == 0.0


def test_summarize_idle_is_pending_time_without_a_step():
    requests = [
        {"sent": 0.0, "answered": 1.0, "ttft_s": 1.0, "prompt_tokens": 100, "offered_tokens": 64, "cached_tokens": 64},
        {"sent": 0.5, "answered": 2.0, "ttft_s": 1.5, "prompt_tokens": 100, "offered_tokens": 64, "cached_tokens": 32},
    ]
    # Steps cover [0.2, 0.6] and [1.0, 1.5]: pending 2.0 s, busy inside it 0.9 s.
    iterations = [{"t": 0.6, "elapsed_ms": 400.0}, {"t": 1.5, "elapsed_ms": 500.0}]
    s = summarize(requests, iterations, kv_wait_in_step_s=0.1)
    assert s["pending_s"] == pytest.approx(2.0)
    assert s["gap_idle_s"] == pytest.approx(1.1)
    assert s["gap_idle_fraction"] == pytest.approx(0.55)
    assert s["idle_fraction"] == pytest.approx(0.6)
    assert s["pull_hit_fraction"] == pytest.approx(0.75)
    assert s["ttft_p50_s"] == pytest.approx(1.25)


def test_step_model_recovers_a_linear_law_and_excess_is_the_extra_time():
    its = [
        {
            "uncached_prompt_tokens": u,
            "cached_prompt_tokens": c,
            "batch_size": b,
            "elapsed_ms": 5 + 0.1 * u + 0.02 * u * (u + c) / 1000 + 2 * b,
        }
        for u, c, b in [(10, 0, 1), (200, 3000, 1), (400, 1000, 2), (50, 6000, 3), (300, 200, 1), (120, 4000, 2)]
    ]
    coef = fit_step_model(its)
    assert coef == pytest.approx([5, 0.1, 0.02, 2], abs=1e-6)
    slower = [{**i, "elapsed_ms": i["elapsed_ms"] + 10} for i in its]
    assert excess_step_s(slower, coef) == pytest.approx(0.06)
    assert excess_step_s(its, coef) == pytest.approx(0.0, abs=1e-9)


def test_workload_contexts_grow_by_appending():
    w = Workload(sessions=2, turns=3, base_tokens=(100, 120), tool_tokens=(10, 20), assistant_tokens=(5, 5))
    ctx = w.contexts()
    assert len(ctx) == 2 and all(len(c) == 4 for c in ctx)
    for c in ctx:
        for prev, cur in zip(c, c[1:], strict=False):
            assert cur[: len(prev)] == prev and 15 <= len(cur) - len(prev) <= 25
    assert w.contexts() == ctx  # seeded


def test_percentile_interpolates():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([5], 95) == 5
