"""Busy steps get their wall time; steps after idle keep their forward time."""

from __future__ import annotations

import dataclasses

import pytest

from core import Phase
from planner.cadence import StepCadence, coalesce_decode_steps
from planner.types import IterationRecord


def rec(node: str, t: float, elapsed_ms: float) -> IterationRecord:
    return IterationRecord(node, Phase.DECODE, t, 8, 0, 0, 8, 4000, elapsed_ms)


def test_back_to_back_steps_last_from_the_previous_end() -> None:
    c = StepCadence(max_gap_ms=20.0)
    out = c.apply([rec("a", 10.0024, 2.4), rec("a", 10.0097, 2.4), rec("a", 10.0170, 2.5)])
    assert out[0].elapsed_ms == 2.4  # nothing before it: forward time
    assert out[1].elapsed_ms == pytest.approx(7.3) and out[2].elapsed_ms == pytest.approx(7.3)
    # The last end is kept across calls.
    (nxt,) = c.apply([rec("a", 10.0240, 2.0)])
    assert nxt.elapsed_ms == pytest.approx(7.0)


def test_a_step_after_idle_keeps_its_forward_time_and_nodes_are_separate() -> None:
    c = StepCadence(max_gap_ms=20.0)
    out = c.apply([rec("a", 1.0, 3.0), rec("b", 1.001, 3.0), rec("a", 1.5, 3.0), rec("b", 1.006, 3.0)])
    by = {(r.node_id, r.t): r.elapsed_ms for r in out}
    assert by[("a", 1.5)] == 3.0  # 497 ms idle before it
    assert by[("b", 1.006)] == pytest.approx(5.0)
    assert [r.t for r in out] == sorted(r.t for r in out)
    c.forget("a")
    assert c.apply([rec("a", 1.505, 3.0)])[0].elapsed_ms == 3.0


def test_overlap_or_clock_skew_never_shortens_a_step() -> None:
    c = StepCadence()
    out = c.apply([rec("a", 2.0, 3.0), rec("a", 2.002, 3.0)])  # starts before the previous ended
    assert out[1].elapsed_ms == 3.0
    with pytest.raises(ValueError, match="max_gap_ms must be >= 0"):
        StepCadence(max_gap_ms=-1)


def test_runs_of_decode_steps_at_one_batch_become_one_mean_record() -> None:
    prefill = IterationRecord("a", Phase.DECODE, 1.05, 1, 500, 0, 0, 0, 40.0)
    rows = [rec("a", 1.0 + 0.01 * i, 2.0 + i) for i in range(3)] + [prefill]
    rows += [IterationRecord("a", Phase.DECODE, 1.1 + 0.01 * i, 4, 0, 0, 4, 2000 + 100 * i, 3.0) for i in range(2)]
    rows += [rec("b", 1.0, 9.0)]
    out = coalesce_decode_steps(rows, max_steps=32)
    assert [(r.node_id, r.batch_size, r.t) for r in out] == [
        ("b", 8, 1.0),
        ("a", 8, 1.02),
        ("a", 1, 1.05),
        ("a", 4, 1.11),
    ]
    merged = out[1]
    assert merged.elapsed_ms == pytest.approx(3.0) and merged.generated_tokens == 24 and merged.context_tokens == 4000
    assert out[3].context_tokens == 2050 and out[3].elapsed_ms == 3.0
    assert out[2] is prefill  # a prefill passes unchanged and ends the run before it
    capped = coalesce_decode_steps([rec("a", 1.0 + 0.01 * i, 2.0) for i in range(5)], max_steps=2)
    assert [r.generated_tokens for r in capped] == [16, 16, 8]
    with pytest.raises(ValueError, match="max_steps must be >= 1"):
        coalesce_decode_steps([], max_steps=0)


def test_a_merged_run_carries_the_mean_cpu_share_of_the_steps_that_report_one() -> None:
    shares = [0.5, None, 1.0]
    rows = [dataclasses.replace(rec("a", 1.0 + 0.01 * i, 2.0), cpu_share=s) for i, s in enumerate(shares)]
    (merged,) = coalesce_decode_steps(rows)
    assert merged.cpu_share == pytest.approx(0.75)
    (blind,) = coalesce_decode_steps([rec("a", 1.0 + 0.01 * i, 2.0) for i in range(3)])
    assert blind.cpu_share is None
