"""Move verification: verdicts on literal spans, the decaying error band, and the planner's revert."""

from __future__ import annotations

import math

import pytest

from planner.verification import MoveVerifier, TickCounts, VerifyConfig
from testing.planner_records import synthetic_samples
from tests.unit.planner.test_evolving import LAX, PREFILL_HEAVY, _planner, _run_live, _view

Z = 1.645


def _verifier(rates: list[tuple[float, int, float]], **cfg: float) -> MoveVerifier:
    """Ticks every 10 s from t=10: (until t, finished per tick, e2e s) triples; waiting 0."""
    # cfg: config fields of mixed types, overridden by keyword in the tests.
    v = MoveVerifier(VerifyConfig(**cfg).resolved(60.0, 600.0), Z, retention_s=600.0)  # type: ignore[arg-type]
    t = 10.0
    for until, per_tick, e2e in rates:
        while t <= until:
            v.add(TickCounts(t, per_tick, e2e * per_tick, e2e * e2e * per_tick, per_tick))
            t += 10.0
    return v


def _after(v: MoveVerifier, start: float, end: float, per_tick: int, e2e: float = 1.0, draining_until: float = 0.0):
    verdict, t = None, start
    while t <= end and verdict is None:
        v.add(TickCounts(t, per_tick, e2e * per_tick, e2e * e2e * per_tick, per_tick))
        verdict = v.check(t, t <= draining_until, 5)
        t += 10.0
    return verdict, t - 10.0


def test_a_move_that_delivered_is_kept_and_leaves_no_error() -> None:
    v = _verifier([(100.0, 100, 1.0)])  # 10 finished/s before the move at t=100
    assert v.start(100.0, 3, 5, "throughput", predicted=0.25, predicted_sd=0.05)
    verdict, t = _after(v, 110.0, 400.0, 130)  # 13/s after
    assert verdict is not None and t == 170.0  # settled at the move's tick, + 1 s response time + 60 s measured
    assert verdict.realized == pytest.approx(0.3) and verdict.delivered and not verdict.revert
    assert v.error(t, "throughput") == 0.0 and v.pending is None


def test_a_move_that_did_not_deliver_is_reverted_and_its_miss_decays() -> None:
    v = _verifier([(100.0, 100, 1.0)])
    v.start(100.0, 3, 5, "throughput", predicted=0.2, predicted_sd=0.02)
    verdict, t = _after(v, 110.0, 400.0, 90)  # 9/s: 10 % fewer
    assert verdict is not None and verdict.realized == pytest.approx(-0.1)
    assert verdict.measured_sd == pytest.approx(0.9 * math.sqrt(1 / 600 + 1 / 540))
    assert not verdict.delivered and verdict.revert and v.reverts == 1
    assert verdict.inputs()["predicted_gain_frac"] == 0.2 and verdict.inputs()["move_reverted"] == 1.0
    assert v.error(t, "throughput") == pytest.approx(0.3)
    assert v.error(t + 600.0, "throughput") == pytest.approx(0.15)  # one half-life later
    assert v.error(t, "latency") == 0.0


def test_less_than_predicted_but_a_measured_gain_is_kept_and_counted() -> None:
    v = _verifier([(100.0, 100, 1.0)])
    v.start(100.0, 3, 5, "throughput", predicted=0.5, predicted_sd=0.05)
    verdict, t = _after(v, 110.0, 400.0, 120)
    assert verdict is not None and verdict.realized == pytest.approx(0.2)
    assert not verdict.delivered and not verdict.revert
    assert v.error(t, "throughput") == pytest.approx(0.3)


def test_long_responses_are_waited_for_before_the_span_is_measured() -> None:
    v = _verifier([(100.0, 100, 120.0)])  # two-minute responses before the move
    v.start(100.0, 3, 5, "throughput", predicted=0.2, predicted_sd=0.02)
    verdict, t = _after(v, 110.0, 600.0, 120, e2e=120.0)
    assert verdict is not None and t == 100.0 + 120.0 + 60.0 and verdict.delivered


def test_responses_longer_after_the_move_than_before_are_waited_for_too() -> None:
    # Early in a run only short requests have finished (1 s before the move); the requests
    # finishing after it take 200 s: the check waits for them, not for the 1 s measured before.
    v = _verifier([(100.0, 100, 1.0)])
    v.start(100.0, 3, 5, "throughput", predicted=0.2, predicted_sd=0.02)
    verdict, t = _after(v, 110.0, 600.0, 120, e2e=200.0)
    assert verdict is not None and t == 100.0 + 200.0 + 60.0 and verdict.delivered


def test_a_draining_switch_delays_the_check_and_a_thin_span_is_not_judged() -> None:
    v = _verifier([(100.0, 100, 1.0)])
    v.start(100.0, 3, 5, "throughput", predicted=0.2, predicted_sd=0.02)
    verdict, t = _after(v, 110.0, 400.0, 100, draining_until=140.0)
    assert verdict is not None and t == 150.0 + 70.0  # settled at the first tick with no node draining
    thin = _verifier([(100.0, 1, 1.0)])
    assert not thin.start(100.0, 3, 5, "throughput", predicted=0.2, predicted_sd=0.02)  # 6 < 20 requests before
    assert thin.pending is None and thin.check(200.0, False, 5) is None


def test_a_split_changed_by_other_hands_drops_the_check() -> None:
    v = _verifier([(100.0, 100, 1.0)])
    v.start(100.0, 3, 5, "throughput", predicted=0.2, predicted_sd=0.02)
    v.add(TickCounts(110.0, 100))
    assert v.check(110.0, False, 4) is None and v.pending is None


def test_latency_moves_are_judged_on_mean_response_time() -> None:
    v = _verifier([(100.0, 50, 10.0)])
    v.start(100.0, 3, 5, "latency", predicted=0.2, predicted_sd=0.02)
    verdict, _ = _after(v, 110.0, 400.0, 50, e2e=8.5)
    assert verdict is not None and verdict.realized == pytest.approx(0.15)
    assert verdict.measured_sd == 0.0 and not verdict.delivered  # identical samples: no measurement noise
    assert not verdict.revert  # 15 % shorter is still a gain


def test_bursty_finishes_widen_the_measurement() -> None:
    steady = _verifier([(100.0, 100, 1.0)])
    bursty = MoveVerifier(VerifyConfig().resolved(60.0, 600.0), Z, 600.0)
    for k in range(10):  # the same 1,000 finishes in 100 s, in bursts of 200 every other tick
        bursty.add(TickCounts(10.0 * (k + 1), 200 if k % 2 else 0))
    assert steady.span(40.0, 100.0).finished_var == 600.0  # Poisson floor: no scatter
    burst = bursty.span(40.0, 100.0)
    assert burst.finished == 600 and burst.finished_var == pytest.approx(6 * 12_000.0)  # 6 ticks x var(0/200)
    for v in (steady, bursty):
        v.start(100.0, 3, 5, "throughput", predicted=0.3, predicted_sd=0.02)
    quiet, _ = _after(steady, 110.0, 400.0, 100)
    loud, _ = _after(bursty, 110.0, 400.0, 100)
    assert quiet is not None and loud is not None and quiet.realized == loud.realized == 0.0
    assert not quiet.delivered and quiet.revert  # +30 % predicted, nothing measured, narrow noise
    assert loud.measured_sd > 4 * quiet.measured_sd and loud.delivered  # the scatter could hide +30 %


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="max_wait_s"):
        VerifyConfig(settle_s=60.0, max_wait_s=60.0)
    with pytest.raises(ValueError, match="settle_s"):
        VerifyConfig(settle_s=0.0)
    assert VerifyConfig().resolved(persist_s=90.0, horizon_s=900.0).settle_s == 90.0
    with pytest.raises(ValueError, match="resolve"):
        MoveVerifier(VerifyConfig(), Z, 600.0)


def test_the_planner_keeps_an_slo_repair_the_finish_rate_did_not_follow() -> None:
    # Finishes stay at 1.8/s whatever the split (the fake cluster ignores it), with 4/s
    # offered: 1P breaks the TTFT bound, the repair off 1P predicts more served, and nothing
    # changes. Checked and counted, never reverted: a revert would re-enter the breach and the
    # planner would repair it again after the flap window (it did, every 660 s, before).
    done = synthetic_samples(0, 900, 1.8, seed=3, **PREFILL_HEAVY)
    decisions = _run_live(_planner(), done, _view(1, 8, slo=LAX), 5, 900, arrival_rps=4.0)
    acted = [d for d in decisions if d.acted]
    assert len(acted) == 1 and acted[0].reason.startswith("SLO repair") and acted[0].chosen_split[0] > 1
    move = acted[0]
    assert move.inputs["move_predicted_gain_frac"] > 0.1
    (checked,) = [d for d in decisions if "verified_move_t" in d.inputs]
    assert checked.inputs["verified_move_t"] == move.t and checked.inputs["move_reverted"] == 0.0
    assert checked.inputs["move_delivered"] == 0.0 and abs(checked.inputs["realized_gain_frac"]) < 0.1
    later = [d for d in decisions if d.t > checked.t]
    assert all(d.chosen_split[0] == move.chosen_split[0] for d in later)
    assert any(d.inputs.get("verified_error_throughput_frac", 0.0) > 0.1 for d in later)
    between = [d for d in decisions if move.t < d.t < checked.t]
    assert between and all(not d.acted for d in between)


def test_a_latency_move_that_raised_the_finish_rate_is_kept() -> None:
    # Responses measured longer (as early in a run, when only short ones could have finished
    # before the move), but 30 % more requests finish: served throughput comes first.
    v = _verifier([(100.0, 100, 10.0)])
    v.start(100.0, 3, 5, "latency", predicted=0.2, predicted_sd=0.02)
    verdict, _ = _after(v, 110.0, 400.0, 130, e2e=15.0)
    assert verdict is not None and verdict.realized == pytest.approx(-0.5)
    assert not verdict.delivered and not verdict.revert
    # The same longer responses at the same finish rate: nothing gained, reverted.
    same = _verifier([(100.0, 100, 10.0)])
    same.start(100.0, 3, 5, "latency", predicted=0.2, predicted_sd=0.02)
    flat, _ = _after(same, 110.0, 400.0, 100, e2e=15.0)
    assert flat is not None and not flat.delivered and flat.revert


def test_an_slo_repair_is_checked_and_counted_but_not_reverted() -> None:
    v = _verifier([(100.0, 100, 1.0)])
    assert v.start(100.0, 3, 5, "throughput", predicted=0.03, predicted_sd=0.01, repair_tolerance=0.02)
    verdict, t = _after(v, 110.0, 400.0, 90)  # 10 % fewer finished (fewer arrived, open loop)
    assert verdict is not None and not verdict.delivered and not verdict.revert and v.reverts == 0
    assert v.error(t, "throughput") == pytest.approx(0.13)


def test_an_slo_repair_that_cost_more_than_it_was_allowed_is_reverted() -> None:
    # Allowed 2 % of throughput; 18 % fewer finished, beyond the noise (upper bound -9.8 %):
    # overload, where the model's capacity of the split it had not measured was wrong.
    v = _verifier([(100.0, 100, 1.0)])
    assert v.start(100.0, 3, 5, "throughput", predicted=0.012, predicted_sd=0.024, repair_tolerance=0.02)
    verdict, t = _after(v, 110.0, 400.0, 82)
    assert verdict is not None and verdict.realized == pytest.approx(-0.18)
    assert verdict.realized + Z * verdict.measured_sd < -0.02
    assert not verdict.delivered and verdict.revert and v.reverts == 1
    assert v.error(t, "throughput") == pytest.approx(0.192)


def test_a_latency_move_that_lowered_the_finish_rate_did_not_deliver() -> None:
    # Responses measured 30 % shorter (predicted 24 %), but 21 % fewer requests finish: the ones that
    # do are the short ones, so the move is reverted and its whole predicted gain counts as missed.
    v = _verifier([(100.0, 227, 10.0)])
    v.start(100.0, 6, 5, "latency", predicted=0.24, predicted_sd=0.04)
    verdict, t = _after(v, 110.0, 400.0, 180, e2e=7.0)
    assert verdict is not None and verdict.realized == pytest.approx(0.3)
    assert not verdict.delivered and verdict.revert and v.reverts == 1
    assert v.error(t, "latency") == pytest.approx(0.24)
    # The same shorter responses at the same finish rate: delivered, kept.
    same = _verifier([(100.0, 227, 10.0)])
    same.start(100.0, 6, 5, "latency", predicted=0.24, predicted_sd=0.04)
    kept, _ = _after(same, 110.0, 400.0, 227, e2e=7.0)
    assert kept is not None and kept.delivered and not kept.revert


def test_the_split_stood_on_is_checked_and_its_miss_counts_against_latency_gains() -> None:
    # The model puts the current split's mean response at 3 s; 60 s of finished requests measured 30 s.
    v = _verifier([(300.0, 50, 30.0)])
    assert v.standing(300.0, 3.0, 0.1, last_switch_t=None) == pytest.approx(0.9)  # 27 s of 30
    assert v.error(300.0, "latency") == pytest.approx(0.9) and v.error(300.0, "throughput") == 0.0
    assert v.error(900.0, "latency") == pytest.approx(0.45)  # one half-life later
    # A smaller miss later leaves the larger, decayed one in force; only a larger one is recorded.
    assert v.standing(310.0, 20.0, 0.1, last_switch_t=None) == pytest.approx(1 / 3)
    assert v.error(310.0, "latency") == pytest.approx(0.9 * 0.5 ** (10 / 600))
    # Within the model's sd and the measured mean's standard error: no miss.
    close = _verifier([(300.0, 50, 3.0)])
    assert close.standing(300.0, 3.05, 0.1, last_switch_t=None) == 0.0 and close.error(300.0, "latency") == 0.0
    # Nothing to check with: a switch within the span, a move awaiting its check, too few finished.
    assert close.standing(300.0, 30.0, 0.1, last_switch_t=280.0) is None
    close.start(300.0, 3, 5, "latency", predicted=0.2, predicted_sd=0.02)
    assert close.standing(300.0, 30.0, 0.1, last_switch_t=None) is None
    thin = _verifier([(300.0, 1, 30.0)])
    assert thin.standing(300.0, 3.0, 0.1, last_switch_t=None) is None
