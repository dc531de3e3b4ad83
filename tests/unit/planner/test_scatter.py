"""ScatterBand: the band covers what it sees; correlated errors widen it."""

from __future__ import annotations

import numpy as np
import pytest

from planner.scatter import ScatterBand


def test_band_settles_at_one_sigma_of_normal_errors() -> None:
    band = ScatterBand()
    for e in np.random.default_rng(0).normal(0.0, 0.1, 5000):
        band.update(float(e))
    assert band.sigma == pytest.approx(0.1, rel=0.15)
    assert band.rho == pytest.approx(0.0, abs=0.05)
    assert band.inflation == pytest.approx(1.0, abs=0.1)


def test_band_covers_a_heavy_tail_the_fit_would_clip() -> None:
    """Student-t with 2 dof: its 68.3 % quantile of |e| is 1.32 (scale 0.05 → 0.066)."""
    band = ScatterBand()
    for e in 0.05 * np.random.default_rng(1).standard_t(2, 8000):
        band.update(float(e))
    assert band.sigma == pytest.approx(0.066, rel=0.2)


def test_correlated_errors_inflate_the_parameter_variance() -> None:
    """AR(1) with rho 0.5: variance factor (1 + 0.5) / (1 − 0.5) = 3."""
    rng = np.random.default_rng(2)
    band, e = ScatterBand(), 0.0
    for _ in range(20_000):
        e = 0.5 * e + float(rng.normal(0.0, 0.05))
        band.update(e)
    assert band.rho == pytest.approx(0.5, abs=0.08)
    assert band.inflation == pytest.approx(3.0, rel=0.3)


def test_alternating_errors_never_narrow_the_band() -> None:
    band = ScatterBand()
    for i in range(200):
        band.update(0.1 if i % 2 else -0.1)
    assert band.rho == 0.0 and band.inflation == 1.0


def test_band_follows_a_level_change_within_a_few_hundred_steps() -> None:
    band = ScatterBand()
    rng = np.random.default_rng(3)
    for e in rng.normal(0.0, 0.02, 2000):
        band.update(float(e))
    assert band.sigma == pytest.approx(0.02, rel=0.25)
    for e in rng.normal(0.0, 0.2, 300):
        band.update(float(e))
    assert band.sigma == pytest.approx(0.2, rel=0.3)


def test_non_finite_errors_are_ignored_and_state_round_trips() -> None:
    band = ScatterBand(memory=50.0)
    for e in (0.1, -0.2, float("nan"), 0.05):
        band.update(e)
    assert band.count == 3
    again = ScatterBand.from_dict(band.to_dict())
    assert again == band
