"""ShareEffect: typical share and the learned elasticity of step time to it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from planner.share import MIN_SAMPLES, ShareEffect, clip_share, probe_speed


def test_typical_share_and_a_known_elasticity() -> None:
    effect = ShareEffect()
    shares = [0.5, 1.0] * 200  # typical share 0.75
    for s in shares:
        effect.observe(s)
    assert effect.ref == pytest.approx(0.75)
    for s in shares:  # errors exactly 0.4 · log(ref / s)
        effect.learn(s, 0.4 * math.log(0.75 / s))
    assert effect.gamma == pytest.approx(0.4)
    assert effect.factor(0.375) == pytest.approx(2.0**0.4)  # half the typical share
    assert effect.factor(None) == 1.0


def test_gamma_is_zero_until_enough_shares_and_clipped_to_one() -> None:
    effect = ShareEffect()
    for _ in range(MIN_SAMPLES - 1):
        effect.observe(0.5)
        effect.learn(0.25, 3.0 * math.log(2.0))
    assert effect.gamma == 0.0  # too few shares seen
    effect.observe(0.5)
    effect.learn(0.25, 3.0 * math.log(2.0))
    assert effect.gamma == 1.0  # a slope of 3 is clipped: no step is slower than 1 / share


def test_shares_are_clipped_to_a_stalled_floor() -> None:
    assert clip_share(0.0) == 0.05 and clip_share(1.3) == 1.0 and clip_share(float("nan")) is None
    assert clip_share(None) is None and clip_share(0.7) == 0.7


def test_host_speed_is_the_probe_reciprocal_and_its_elasticity_may_exceed_one() -> None:
    assert probe_speed(500.0) == 2.0 and probe_speed(None) is None
    assert probe_speed(0.0) is None and probe_speed(float("inf")) is None
    effect = ShareEffect(max_gamma=2.0)
    speeds = [1.0, 2.0] * 100  # typical speed 1.5
    for v in speeds:
        effect.observe(v)
    for v in speeds:
        effect.learn(v, 1.5 * math.log(1.5 / v))
    assert effect.gamma == pytest.approx(1.5)  # a step slows 1.5x as much as the probe does


def test_an_anchored_effect_is_used_only_while_it_predicts_better_than_none() -> None:
    """Errors that follow the speed: the slope is used. Errors that do not
    (independent draws): whatever slope chance gives is scored on each step
    before it learns from it, loses to no factor, and gamma stays 0."""
    rng = np.random.default_rng(1)
    speeds = rng.choice([1.0, 1.3], size=2000) * rng.lognormal(0.0, 0.02, 2000)
    follows, ignores = ShareEffect(anchored=True, max_gamma=2.0), ShareEffect(anchored=True, max_gamma=2.0)
    for v, noise in zip(speeds, rng.normal(0.0, 0.05, 2000), strict=True):
        for effect in (follows, ignores):
            effect.observe(float(v))
        follows.learn(float(v), float(math.log(follows.base / v) + noise))
        ignores.learn(float(v), float(noise))
    assert follows.anchor is not None and follows.gain > 0
    assert follows.gamma == pytest.approx(1.0, abs=0.05)
    assert ignores.gain <= 0 and ignores.gamma == 0.0


def test_an_anchored_effect_widens_only_beyond_the_speeds_it_was_fitted_on() -> None:
    """No spread before the anchor, none within the spread of the fitted
    speeds; beyond it, the excess distance times the root mean square of
    (g − gamma) over g in [0, 1]: 1/√3 at gamma 0, 1/√12 at gamma 0.5."""
    rng = np.random.default_rng(2)
    effect = ShareEffect(anchored=True, max_gamma=2.0)
    assert effect.spread(1.0) == 0.0  # unanchored
    speeds = rng.lognormal(0.0, 0.05, 2000)
    for v, noise in zip(speeds, rng.normal(0.0, 0.05, 2000), strict=True):
        effect.observe(float(v))
        effect.learn(float(v), float(noise))  # the steps ignore the speed: gamma 0
    assert effect.gamma == 0.0
    assert effect.spread(effect.base) == 0.0  # the fitted speeds' own scatter
    assert effect.spread(None) == 0.0
    slow = effect.base / math.exp(effect.sx + 0.3)  # 0.3 in log beyond the mean
    excess = 0.3**2 - (effect.sxx - effect.sx**2)
    assert effect.spread(slow) == pytest.approx(math.sqrt(excess / 3.0))
    effect.gain, effect.sxy = 1.0, effect.sx * effect.sy + 0.5 * (effect.sxx - effect.sx**2)  # a slope of 0.5 in use
    assert effect.gamma == pytest.approx(0.5)
    assert effect.spread(slow) == pytest.approx(math.sqrt(excess / 12.0))
