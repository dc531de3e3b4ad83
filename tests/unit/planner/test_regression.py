"""Robust RLS: coefficient recovery, outliers, forgetting, uncertainty."""

from __future__ import annotations

import numpy as np
import pytest

from planner.regression import RecursiveLeastSquares, RLSConfig

TRUE = np.array([5.0, 0.2, -0.03])
SCALES = (1.0, 100.0, 1000.0)


def _data(n: int, seed: int, noise: float = 0.5, outlier_rate: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = np.column_stack([np.ones(n), rng.uniform(0, 500, n), rng.uniform(0, 5000, n)])
    y = x @ TRUE + rng.normal(0, noise, n)
    bad = rng.random(n) < outlier_rate
    y[bad] += rng.uniform(50, 500, bad.sum())
    return x, y


def test_recovers_coefficients_and_noise() -> None:
    model = RecursiveLeastSquares(SCALES, RLSConfig(forgetting=1.0))
    model.update_many(*_data(2000, seed=1))
    assert model.theta == pytest.approx(TRUE, rel=0.02, abs=0.05)
    assert model.sigma == pytest.approx(0.5, rel=0.15)


def test_outliers_bounded_influence() -> None:
    robust = RecursiveLeastSquares(SCALES, RLSConfig(forgetting=1.0))
    robust.update_many(*_data(2000, seed=2, outlier_rate=0.1))
    assert robust.theta == pytest.approx(TRUE, rel=0.05, abs=0.3)
    assert robust.sigma < 3.0  # a plain fit's sigma would be ~50


def test_forgetting_tracks_a_change() -> None:
    model = RecursiveLeastSquares(SCALES, RLSConfig(forgetting=0.99))
    x, y = _data(1500, seed=3)
    model.update_many(x, y)
    model.update_many(x[:1000], y[:1000] * 2.0)  # the node got twice as slow
    assert model.theta == pytest.approx(2 * TRUE, rel=0.05, abs=0.3)


def test_parameter_uncertainty_shrinks_with_data() -> None:
    model = RecursiveLeastSquares(SCALES, RLSConfig(forgetting=1.0))
    x, y = _data(4000, seed=4)
    model.update_many(x[:50], y[:50])
    _, sd_few = model.predict(x[0], include_noise=False)
    model.update_many(x[50:], y[50:])
    mean, sd_many = model.predict(x[0], include_noise=False)
    _, sd_obs = model.predict(x[0], include_noise=True)
    assert sd_many < sd_few / 4
    assert sd_obs == pytest.approx(0.5, rel=0.2)  # noise dominates once parameters are known
    assert mean == pytest.approx(float(x[0] @ TRUE), abs=0.2)


def test_round_trip_and_known_coefficients() -> None:
    model = RecursiveLeastSquares(SCALES)
    model.update_many(*_data(30, seed=5))
    clone = RecursiveLeastSquares.from_dict(model.to_dict())
    assert clone.predict([1.0, 100.0, 1000.0]) == pytest.approx(model.predict([1.0, 100.0, 1000.0]))
    known = RecursiveLeastSquares.from_coefficients((1.0, 2.0, 3.0), SCALES)
    assert known.predict([1.0, 1.0, 1.0], include_noise=False) == pytest.approx((6.0, 0.0))


def test_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match=r"forgetting must be in \(0.9, 1\]"):
        RLSConfig(forgetting=0.5)
    with pytest.raises(ValueError, match="one value per feature"):
        RecursiveLeastSquares(SCALES).update([1.0, 2.0], 1.0)
    with pytest.raises(ValueError, match="x must be finite"):
        RecursiveLeastSquares(SCALES).update([1.0, np.nan, 2.0], 1.0)


def test_noiseless_fit_still_follows_a_change() -> None:
    # With a zero-noise estimate every later residual would look like an
    # outlier; the relative sigma floor keeps the model able to move.
    model = RecursiveLeastSquares(SCALES, RLSConfig(forgetting=0.995))
    x, y = _data(600, seed=6, noise=0.0)
    model.update_many(x, y)
    model.update_many(x, y * 1.5)
    assert model.theta == pytest.approx(1.5 * TRUE, rel=0.05, abs=0.1)
