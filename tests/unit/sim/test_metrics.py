"""Run metrics: completed / arrived, goodput, E2E over all requests, flaps (literal values)."""

from __future__ import annotations

import pytest

from core import Phase
from sim.metrics import RunLog, count_flaps, split_moves
from sim.switching import SwitchEvent


def Ev(t: float, to_phase: str) -> SwitchEvent:
    to = Phase(to_phase)
    return SwitchEvent(t=t, node_id="n", from_phase=to.other, to_phase=to, total_s=2.0)


def test_unfinished_requests_count_at_the_horizon_and_goodput_needs_both_slos() -> None:
    log = RunLog(ttft_slo_s=1.0, tpot_slo_s=0.1, flap_window_s=100.0)
    # arrival, first token, finish, prompt, output, migrations
    log.rows = [(0.0, 0.5, 2.5, 10, 21, 0), (1.0, 3.0, 4.0, 10, 11, 0), (2.0, 2.2, 6.2, 10, 11, 0)]
    log.arrived, log.unfinished_arrivals = 5, [80.0, 90.0]
    log.finish([], [], 0, 100.0)
    s = log.summary()
    assert (s["completed"], s["arrived"], s["completed_fraction"]) == (3, 5, 0.6)
    assert s["mean_e2e_s"] == pytest.approx((2.5 + 3.0 + 4.2) / 3, abs=1e-4)
    assert s["mean_e2e_all_s"] == pytest.approx((2.5 + 3.0 + 4.2 + 20.0 + 10.0) / 5, abs=1e-4)
    # only the first meets TTFT <= 1 s and TPOT (2.0 s / 20 tokens = 0.1 s) <= 0.1 s; the third's TPOT is 0.4 s
    assert s["goodput_rps"] == pytest.approx(1 / 100.0) and s["throughput_rps"] == pytest.approx(0.03)


def test_moves_net_one_ticks_switches_and_flaps_go_back_within_the_window() -> None:
    events = [Ev(10, "prefill"), Ev(10, "prefill"), Ev(70, "decode"), Ev(300, "decode"), Ev(300, "prefill")]
    moves = split_moves(events, 3)
    assert moves == [(10, 3, 5), (70, 5, 4)]  # the tick at 300 moved one node each way: no move
    assert count_flaps(moves, 100.0) == 0  # 5 -> 4 corrects an overshoot: not back to 3
    assert count_flaps([(10, 3, 5), (70, 5, 3)], 100.0) == 1 and count_flaps([(10, 3, 5), (70, 5, 3)], 60.0) == 0
    assert count_flaps([(0, 2, 3), (50, 3, 4), (90, 4, 3), (500, 3, 4), (550, 4, 3)], 100.0) == 2
    log = RunLog(flap_window_s=100.0)
    log.split = [(0.0, 3, 6, 0)]
    log.finish([], [Ev(10, "prefill"), Ev(70, "decode")], 0, 400.0)
    s = log.summary()
    assert (s["moves"], s["flaps"], s["switches"]) == (2, 1, 2)


def test_served_counts_the_requests_that_had_slack_to_finish() -> None:
    log = RunLog()
    # Horizon 2,400 s: slack min(300, 2400 / 6) = 300 s, cut at 2,100 s.
    log.rows = [
        (10.0, 11.0, 20.0, 10, 5, 0),
        (2_099.0, 2_100.0, 2_110.0, 10, 5, 0),
        (2_300.0, 2_301.0, 2_390.0, 10, 5, 0),
    ]
    log.arrived, log.unfinished_arrivals = 4, [2_050.0]
    log.finish([], [], 0, 2_400.0)
    s = log.summary()
    assert (s["served"], s["throughput_rps"]) == (2, 0.0013)
    short = RunLog()
    short.rows = [(10.0, 11.0, 20.0, 10, 5, 0), (55.0, 56.0, 58.0, 10, 5, 0)]
    short.finish([], [], 0, 60.0)  # 60 s: slack 10 s
    assert short.summary()["served"] == 1
