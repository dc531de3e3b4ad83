"""workers.host_speed: a fixed computation timed in thread CPU time, probed at most every few seconds, smoothed."""

from __future__ import annotations

import time

import pytest

from workers.host_speed import HostSpeedMeter, reference_work


def _meter(costs_us: list[float], every_s: float = 1.0, smoothing: float = 0.5) -> tuple[HostSpeedMeter, list[float]]:
    """A meter whose fake thread clock advances by the next cost at each
    probe, and a fake monotonic clock the test moves."""
    clock = [0.0]
    cpu = [0]
    pending = list(costs_us)

    def work() -> None:
        cpu[0] += int(pending.pop(0) * 1000)

    meter = HostSpeedMeter(
        every_s=every_s, smoothing=smoothing, clock=lambda: clock[0], cpu_ns=lambda: cpu[0], work=work
    )
    return meter, clock


def test_probes_at_most_every_interval_and_smooths_the_costs() -> None:
    meter, clock = _meter([400.0, 800.0, 600.0])
    assert meter.read() == 400.0  # the first probe is taken as it is
    clock[0] = 0.5
    assert meter.read() == 400.0  # too soon: no probe, the last value
    clock[0] = 1.0
    assert meter.read() == 600.0  # 400 + 0.5 · (800 − 400)
    clock[0] = 2.5
    assert meter.read() == 600.0  # 600 + 0.5 · (600 − 600)


def test_a_clock_that_measured_nothing_keeps_the_last_value() -> None:
    meter, clock = _meter([0.0, 300.0])
    assert meter.read() is None
    clock[0] = 1.0
    assert meter.read() == 300.0


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="smoothing"):
        HostSpeedMeter(smoothing=0.0)
    with pytest.raises(ValueError, match="every_s"):
        HostSpeedMeter(every_s=-1.0)


def test_the_real_probe_costs_well_under_a_step() -> None:
    """On this host: a few hundred CPU µs, measured by the thread clock."""
    reference_work()  # warm
    start = time.thread_time_ns()
    reference_work()
    cost_us = (time.thread_time_ns() - start) / 1e3
    assert 0 < cost_us < 20_000
    assert HostSpeedMeter(every_s=0.0).read() is not None
