"""Saturation: a phase whose queues keep growing is corrected to the rate it actually served."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from core import Phase
from planner.saturation import QueueHistory, SaturationConfig, correction, scaled
from planner.types import ClusterView, Decision
from planner.workload import WorkloadEstimate
from testing.planner_records import synthetic_samples
from tests.unit.planner.test_evolving import LAX, _apply, _planner, _view

CFG = SaturationConfig(queue_per_node=2.0, idle_per_node=1.0, other_share=0.1, span_s=30.0, margin=0.1, max_factor=20.0)


def _history(rows: list[tuple[float, float, float]], prefill_nodes: int = 2, decode_nodes: int = 4) -> QueueHistory:
    """Rows of (t, waiting per prefill node, waiting per decode node)."""
    h = QueueHistory(retention_s=600.0)
    for t, pre, dec in rows:
        h.add(t, (pre * prefill_nodes, prefill_nodes), (dec * decode_nodes, decode_nodes))
    return h


@pytest.mark.parametrize(
    ("rows", "last_switch_t", "expected"),
    [
        # decode queues grow at every tick of the last 30 s, prefill idle: decode is the bottleneck
        ([(0, 0.0, 0.5), (10, 0.0, 3.0), (20, 0.2, 6.0), (30, 0.0, 9.0), (40, 0.0, 12.0)], None, Phase.DECODE),
        ([(0, 0.0, 0.5), (10, 3.0, 0.0), (20, 4.0, 0.5), (30, 4.0, 0.0), (40, 5.0, 0.9)], None, Phase.PREFILL),
        # a stable queue, or a backlog draining, still means the phase never ran dry
        ([(0, 0.0, 0.0), (10, 0.0, 4.0), (20, 0.0, 4.0), (30, 0.0, 4.0), (40, 0.0, 4.0)], None, Phase.DECODE),
        ([(0, 0.0, 90.0), (10, 0.0, 60.0), (20, 0.0, 40.0), (30, 0.0, 20.0), (40, 0.0, 10.0)], None, Phase.DECODE),
        # one tick below the threshold inside the span: not saturated
        ([(0, 0.0, 0.5), (10, 0.0, 3.0), (20, 0.0, 1.5), (30, 0.0, 9.0), (40, 0.0, 12.0)], None, None),
        # both phases queue alike: neither is the only bottleneck
        ([(0, 2.0, 3.0), (10, 2.0, 3.0), (20, 2.0, 6.0), (30, 2.0, 9.0), (40, 2.0, 12.0)], None, None),
        # 3 per prefill node (6) beside 40 per decode node (160): under 10 % of the waiting, decode is it
        ([(0, 3.0, 40.0), (10, 3.0, 40.0), (20, 3.0, 40.0), (30, 3.0, 40.0), (40, 3.0, 40.0)], None, Phase.DECODE),
        # a switch within the span: a draining node served less
        ([(0, 0.0, 0.5), (10, 0.0, 3.0), (20, 0.0, 6.0), (30, 0.0, 9.0), (40, 0.0, 12.0)], 15.0, None),
        # history shorter than the span proves nothing
        ([(20, 0.0, 6.0), (30, 0.0, 9.0), (40, 0.0, 12.0)], None, None),
    ],
)
def test_saturated_phase(rows: list[tuple[float, float, float]], last_switch_t: float | None, expected: Phase | None):
    found = _history(rows).saturated(40.0, CFG, last_switch_t, longest_s=60.0)
    assert (found and found[0]) is expected


def test_the_finish_rate_is_measured_over_as_long_as_the_phase_stayed_saturated() -> None:
    rows = [(float(t), 0.0, 0.0 if t < 30 else 5.0) for t in range(0, 130, 10)]  # busy from t=30
    h = _history(rows)
    assert h.saturated(50.0, CFG, None, longest_s=60.0) is None  # 20 s busy < the 30 s span
    assert h.saturated(60.0, CFG, None, longest_s=60.0) == (Phase.DECODE, 30.0)
    assert h.saturated(80.0, CFG, None, longest_s=60.0) == (Phase.DECODE, 50.0)
    assert h.saturated(120.0, CFG, None, longest_s=60.0) == (Phase.DECODE, 60.0)  # at most the window
    assert h.saturated(120.0, CFG, 85.0, longest_s=60.0) == (Phase.DECODE, 35.0)  # not back past a switch


def test_early_decode_queues_need_the_shorter_span_only() -> None:
    # Decode queues from t=30 only: early, 10 s of them proves saturation, not the config's 30 s span.
    cfg = dataclasses.replace(CFG, early_span_s=10.0)
    h = _history([(0, 0.0, 0.0), (10, 0.0, 0.0), (20, 0.0, 1.0), (30, 0.0, 3.0), (40, 0.0, 5.0)])
    assert h.saturated(40.0, cfg, None, longest_s=60.0) is None
    assert h.saturated(40.0, cfg, None, longest_s=60.0, early=True) == (Phase.DECODE, 10.0)
    # one tick of queues is not a span, and a switch inside the shorter span still voids it
    assert h.saturated(30.0, cfg, None, longest_s=60.0, early=True) is None
    assert h.saturated(40.0, cfg, 35.0, longest_s=60.0, early=True) is None
    # prefill queues keep the full span, early or not
    p = _history([(0, 0.0, 0.0), (10, 0.0, 0.0), (20, 1.0, 0.0), (30, 3.0, 0.0), (40, 5.0, 0.0)])
    assert p.saturated(40.0, cfg, None, longest_s=60.0, early=True) is None


def _w(**kw: float) -> WorkloadEstimate:
    base = {
        "window_s": 60.0,
        "n": 120,
        "rate_rps": 2.0,
        "uncached_mean": 1000.0,
        "uncached_std": 500.0,
        "cached_mean": 2000.0,
        "cached_std": 100.0,
        "output_mean": 100.0,
        "output_std": 50.0,
        "local_fraction": 0.0,
        "n_remote": 120,
        "remote_uncached_mean": 1000.0,
        "remote_uncached_std": 500.0,
        "remote_cached_mean": 2000.0,
        "remote_cached_std": 100.0,
        "local_uncached_mean": 0.0,
        "local_cached_mean": 0.0,
        "remote_pairs_mean": 4.0e6,
        "prompt_output_mean": 3.0e5,
        "output_sq_mean": 1.25e4,
    }
    base.update(kw)
    # base: estimate fields of mixed types, overridden by keyword in the tests.
    return WorkloadEstimate(**base)  # type: ignore[arg-type]


def test_scaled_moves_the_phase_work_only() -> None:
    d = scaled(_w(), Phase.DECODE, 2.5)
    assert (d.output_mean, d.output_std, d.output_sq_mean, d.prompt_output_mean) == (250.0, 125.0, 78125.0, 750000.0)
    assert (d.remote_uncached_mean, d.remote_pairs_mean, d.rate_rps) == (1000.0, 4.0e6, 2.0)
    p = scaled(_w(), Phase.PREFILL, 2.5)
    assert (p.remote_uncached_mean, p.remote_uncached_std, p.remote_pairs_mean) == (2500.0, 1250.0, 1.0e7)
    assert (p.output_mean, p.cached_mean) == (100.0, 2000.0)


def _decode_capacity(ws: list[WorkloadEstimate]) -> np.ndarray:
    return np.array([200.0 / w.output_mean for w in ws])  # a fake model: 2 req/s at 100 output tokens


@pytest.mark.parametrize(
    ("measured", "factor"),
    [
        (0.5, 4.0),  # the model serves 4x what was measured: outputs are 4x longer than the finished ones
        (1.0, 2.0),
        (1.9, 1.0),  # within the 10 % margin
        (2.5, 1.0),  # the model is below the measurement: no correction upwards
        (0.0, 1.0),  # nothing finished: nothing to calibrate on
        (0.05, 20.0),  # beyond max_factor: the largest correction
    ],
)
def test_correction_brings_the_model_to_the_measured_rate(measured: float, factor: float) -> None:
    assert correction(_decode_capacity, _w(), Phase.DECODE, measured, CFG) == pytest.approx(factor, rel=0.01)


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="margin"):
        SaturationConfig(margin=-0.1)
    with pytest.raises(ValueError, match="span_s"):
        SaturationConfig(span_s=0.0)
    with pytest.raises(ValueError, match="other_share"):
        SaturationConfig(other_share=1.0)
    with pytest.raises(ValueError, match="early_span_s"):
        SaturationConfig(span_s=20.0, early_span_s=30.0)
    with pytest.raises(ValueError, match="early_span_s"):
        SaturationConfig(early_span_s=0.0)


def _run(
    queue_per_decode_node, saturation: bool, config: SaturationConfig | None = None, phase: Phase = Phase.DECODE
) -> list[Decision]:
    """5P3D, reasoning turns that finish at ~2 req/s while 4 req/s arrive; each
    node of `phase` (decode unless said) reports `queue_per_decode_node(t)` waiting."""
    samples = sorted(synthetic_samples(0, 400, 2.0, seed=4, uncached=1000, cached=2000, output=300), key=lambda s: s.t)
    planner = _planner(saturation=config or SaturationConfig()) if saturation else _planner(saturation=None)
    view: ClusterView = _view(5, 8, slo=LAX)
    i, out = 0, []
    for t in range(5, 300, 5):
        j = i
        while j < len(samples) and samples[j].t < t:
            j += 1
        planner.observe_requests(samples[i:j])
        i = j
        nodes = tuple(
            dataclasses.replace(n, queue=queue_per_decode_node(t) if n.phase == phase else 0) for n in view.nodes
        )
        view = dataclasses.replace(view, now=float(t), nodes=nodes, requests_arrived=4 * t)
        d = planner.decide(view)
        out.append(d)
        if d.acted:
            view = _apply(view, d)
    return out


def test_growing_decode_queues_move_nodes_to_decode_before_the_finished_mix_would() -> None:
    growing = lambda t: max(0, (t - 40) // 5)  # noqa: E731  # 2 waiting per decode node from t=50, growing
    first = next(d for d in _run(growing, saturation=True) if d.acted)
    # Before min_history_s the queues of 10 s (t=50, 55, 60: early_span_s) suffice.
    assert first.t == 60.0 and first.reason.startswith("early throughput") and first.chosen_split == (1, 7)
    assert first.inputs["saturation_factor"] == pytest.approx(3.29, abs=0.01)
    # The corrected model serves at the current split what finished there.
    at_5p = next(p for p in first.predictions if p.prefill_nodes == 5)
    assert at_5p.capacity_rps == pytest.approx(first.inputs["measured_rps"], rel=0.03)
    # Holding the early rule to the full 20 s span: the move waits one more tick pair.
    full = next(d for d in _run(growing, saturation=True, config=SaturationConfig(early_span_s=None)) if d.acted)
    assert full.t == 70.0 and full.chosen_split == (1, 7)
    assert full.inputs["saturation_factor"] == pytest.approx(3.41, abs=0.01)
    # The same finished requests without the queues: the model sees room everywhere and waits
    # (a latency move, its bound clearing from t=125 and held latency_hold_s = 60 s).
    blind = next(d for d in _run(growing, saturation=False) if d.acted)
    assert blind.t == 185.0 and "saturation_factor" not in blind.inputs
    quiet = next(d for d in _run(lambda t: 0, saturation=True) if d.acted)
    assert quiet.t == blind.t and "saturation_factor" not in quiet.inputs


def test_early_prefill_queues_need_the_full_span() -> None:
    # A prefill finishes only after its decode, so early on the finish rate trails the prefills
    # done: 10 s of prefill queues (t=50..60) correct nothing; the full 20 s (t=70) does.
    growing = lambda t: max(0, (t - 40) // 5)  # noqa: E731
    by_t = {d.t: d for d in _run(growing, saturation=True, phase=Phase.PREFILL) if d.t <= 70}
    assert "saturation_factor" not in by_t[60.0].inputs and "saturation_factor" not in by_t[65.0].inputs
    assert by_t[70.0].inputs["saturated_prefill"] == 1.0 and by_t[70.0].inputs["saturation_factor"] > 1.0
