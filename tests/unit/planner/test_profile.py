"""Iteration-time profile: record classification, fitting, persistence, hold-out MAPE."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

from bench.planner_bench import fit_mape_from_records
from core import Phase
from planner.fit_check import fit_mape
from planner.profile import Profile, classify
from planner.types import IterationRecord
from testing.planner_records import TRUE_DECODE, TRUE_PREFILL, synthetic_records


def _rec(phase: Phase, u: int, c: int, batch: int, ctx: int, ms: float = 10.0) -> IterationRecord:
    return IterationRecord("n0", phase, 0.0, batch, u, c, batch, ctx, ms)


def test_classification_rule() -> None:
    assert classify(_rec(Phase.PREFILL, 500, 100, 2, 0)) == "prefill"
    assert classify(_rec(Phase.DECODE, 200, 0, 1, 0)) == "prefill"  # local prefill, nothing else in the batch
    assert classify(_rec(Phase.DECODE, 0, 0, 8, 4000)) == "decode"
    assert classify(_rec(Phase.DECODE, 200, 0, 9, 4000)) is None  # mixed batch trains neither
    assert classify(_rec(Phase.PREFILL, 0, 0, 0, 0)) is None


def test_recovers_known_coefficients_with_outliers() -> None:
    profile = Profile.from_records(synthetic_records(4000, seed=7, noise=0.02, outlier_rate=0.03))
    a, b, c, d = profile.prefill.rls.theta
    assert (a, b, c, d) == pytest.approx(TRUE_PREFILL, rel=0.15, abs=2.0)
    assert profile.decode.rls.theta == pytest.approx(TRUE_DECODE, rel=0.1, abs=1.0)
    mean, sd = profile.predict_prefill_ms(4000, 8000)
    true = TRUE_PREFILL[0] + TRUE_PREFILL[1] * 4000 + TRUE_PREFILL[2] * 8000 + TRUE_PREFILL[3] * 4000 * 12000 / 1e4
    assert mean == pytest.approx(true, rel=0.03)
    assert sd > 0


def test_batched_prefill_records_fit_with_their_attention_pairs() -> None:
    """Iterations of 1-4 prompts: time follows Σ u_i(u_i+c_i); fitted on the
    records' attention_pairs the model recovers the coefficients (on the
    batch's totals, u·(u+c) would overstate a batch's attention)."""
    import random

    rng = random.Random(3)
    true = (20.0, 0.05, 0.004, 0.5)
    recs = []
    for i in range(2000):
        prompts = [(rng.randrange(50, 3000), rng.randrange(0, 20000)) for _ in range(rng.randrange(1, 5))]
        u, c = sum(p[0] for p in prompts), sum(p[1] for p in prompts)
        pairs = sum(p[0] * (p[0] + p[1]) for p in prompts)
        ms = true[0] + true[1] * u + true[2] * c + true[3] * pairs / 1e4
        recs.append(IterationRecord("n0", Phase.PREFILL, float(i), len(prompts), u, c, 0, 0, ms, pairs))
    profile = Profile.from_records(recs)
    assert tuple(profile.prefill.rls.theta) == pytest.approx(true, rel=0.02, abs=0.05)


def test_json_round_trip(tmp_path: Path) -> None:
    profile = Profile.from_records(synthetic_records(200, seed=8))
    path = tmp_path / "profile.json"
    profile.to_json(path)
    loaded = Profile.from_json(path)
    assert loaded.predict_decode_ms(16, 40_000) == pytest.approx(profile.predict_decode_ms(16, 40_000))
    assert loaded.predict_prefill_ms(900, 0) == pytest.approx(profile.predict_prefill_ms(900, 0))


def test_fit_mape_on_held_back_records() -> None:
    records = synthetic_records(3000, seed=9, noise=0.05, outlier_rate=0.01)
    report = fit_mape(records, holdout_fraction=0.3)
    assert report.test_prefill == 450 and report.train_prefill == 1050
    assert report.mape_prefill is not None and report.mape_prefill < 0.1
    assert report.mape_decode is not None and report.mape_decode < 0.1
    # Hindsight floor: 5 % Gaussian timing noise is a MAPE of 0.05·sqrt(2/pi) ≈ 0.04.
    assert report.floor_decode == pytest.approx(0.04, abs=0.01)
    assert report.floor_prefill == pytest.approx(0.04, abs=0.01)
    only_decode = [r for r in records if r.uncached_prompt_tokens == 0]
    assert fit_mape_from_records(only_decode)["fit_mape_prefill"] is None
    assert fit_mape_from_records(only_decode)["fit_mape_floor"]["prefill"] is None


def _shared(records: list[IterationRecord], shares: list[float]) -> list[IterationRecord]:
    """Records slowed by a CPU share (wall = cost / share), the share recorded."""
    return [
        dataclasses.replace(r, elapsed_ms=r.elapsed_ms / s, cpu_share=s) for r, s in zip(records, shares, strict=True)
    ]


def test_cpu_share_explains_a_neighbour_slowing_the_steps() -> None:
    """Blocks of 100 steps at shares 1, 0.5, 0.8, 0.65 (mean 0.7375), wall =
    cost / share: the model learns gamma = 1 and predicts each step at its
    own share; its coefficients are wall time at the typical share."""
    records = synthetic_records(3000, seed=3, noise=0.03)
    shares = [(1.0, 0.5, 0.8, 0.65)[(i // 100) % 4] for i in range(3000)]
    profile = Profile.from_records(_shared(records, shares))
    assert profile.decode.share.ref == pytest.approx(0.7375, abs=0.01)
    assert profile.decode.share.gamma == pytest.approx(1.0, abs=0.05)
    assert profile.decode.theta == pytest.approx(np.array(TRUE_DECODE) / 0.7375, rel=0.05, abs=0.2)
    step = dataclasses.replace(records[1], cpu_share=0.5)
    cost = TRUE_DECODE[0] + TRUE_DECODE[1] * step.batch_size + TRUE_DECODE[2] * step.context_tokens
    assert profile.decode.predict(step) == pytest.approx(cost / 0.5, rel=0.05)
    report = fit_mape(_shared(records, shares))
    assert report.mape_decode is not None and report.mape_decode < 0.04  # 3 % noise: MAPE 0.024
    blind = fit_mape([dataclasses.replace(r, cpu_share=None) for r in _shared(records, shares)])
    assert blind.mape_decode is not None and blind.mape_decode > 0.15  # the level shifts the share explains


def test_a_share_that_does_not_slow_the_steps_gets_gamma_zero() -> None:
    """Shares measured but unrelated to step time (other threads waiting):
    dividing by them would add error; the learned gamma stays near 0."""
    records = synthetic_records(3000, seed=4, noise=0.03)
    shares = np.random.default_rng(5).uniform(0.3, 1.0, 3000).tolist()
    noisy = [dataclasses.replace(r, cpu_share=s) for r, s in zip(records, shares, strict=True)]
    profile = Profile.from_records(noisy)
    assert profile.decode.share.gamma == pytest.approx(0.0, abs=0.05)
    report = fit_mape(noisy)
    assert report.mape_decode is not None and report.mape_decode < 0.04


def test_preempted_steps_are_rejected_and_the_band_covers_the_rest() -> None:
    records = synthetic_records(4000, seed=5, noise=0.05, outlier_rate=0.03)
    profile = Profile.from_records(records)
    # ~3 % of 2,000 decode steps are 3-10x slow: all beyond 6 bands of a ~5 % band.
    assert 40 <= profile.decode.rejected <= 85  # 67 here
    assert profile.decode.noise_sigma == pytest.approx(0.05, rel=0.3)
    assert profile.decode.theta == pytest.approx(TRUE_DECODE, rel=0.05, abs=0.2)
    report = fit_mape(synthetic_records(3000, seed=6, noise=0.05))
    assert report.band_decode == pytest.approx(0.9, abs=0.05)
    assert report.band_prefill == pytest.approx(0.9, abs=0.05)


def test_profile_json_keeps_the_host_part_and_loads_older_files(tmp_path: Path) -> None:
    records = synthetic_records(1000, seed=4)
    profile = Profile.from_records(_shared(records, [0.6] * 1000))
    loaded = Profile.from_dict(profile.to_dict())
    assert loaded.decode.share.ref == pytest.approx(0.6)
    assert loaded.decode.share == profile.decode.share and loaded.decode.scatter == profile.decode.scatter
    assert loaded.predict_decode_ms(16, 40_000) == pytest.approx(profile.predict_decode_ms(16, 40_000))
    old = {k: v for k, v in profile.to_dict().items() if not k.endswith("_host")}
    assert Profile.from_dict(old).decode.share.ref == 1.0


def test_a_band_wider_than_the_fit_widens_the_covariance_the_planner_reads() -> None:
    profile = Profile.from_records(synthetic_records(2000, seed=2, noise=0.03))
    d = profile.decode
    d.scatter.log_q = float(np.log(2.0 * d.rls.sigma))  # the band: twice the fit's sigma
    d.scatter._m2, d.scatter._lag = 1.0, 0.5  # lag-one correlation 0.5: variance x 3
    assert d.widen == pytest.approx(4.0 * 3.0)
    assert d.param_cov == pytest.approx(d.rls.param_cov * 12.0)
    mean, sd = profile.predict_decode_ms(16, 40_000, include_noise=False)
    bare = d.rls.predict(np.array([1.0, 16.0, 40_000.0]), include_noise=False)[1]
    assert sd == pytest.approx(bare * math.sqrt(12.0))


def _slow_spell(records: list[IterationRecord], seed: int) -> list[IterationRecord]:
    """The host 1.3x slower from 40 % to 65 % of the run (a neighbour on the
    caches, the CPU share untouched): steps and the host probe slow alike;
    the probe scatters by 4 % (one probe by ~15 %, a worker's smoothed value
    averages ~15 of them)."""
    rng = np.random.default_rng(seed)
    ordered = sorted(records, key=lambda r: r.t)
    out = []
    for i, r in enumerate(ordered):
        slow = 1.3 if 0.4 <= i / len(ordered) < 0.65 else 1.0
        probe = 400.0 * slow * float(rng.lognormal(0.0, 0.04))
        out.append(dataclasses.replace(r, elapsed_ms=r.elapsed_ms * slow, host_probe_us=probe))
    return out


def test_host_probe_explains_a_slow_spell_the_share_does_not_see() -> None:
    """Fitted through a spell (forgetting 0.999) a blind model has learned
    the slow host and mispredicts the later, normal steps by 7 %; with the
    probe it learns the spell's elasticity (attenuated by the probe's
    scatter) and comes within 4 % (3 % timing noise: a floor of 0.024)."""
    records = _slow_spell(synthetic_records(3000, seed=11, noise=0.03), seed=12)
    profile = Profile.from_records(records)
    assert profile.decode.speed.gamma == pytest.approx(1.0, abs=0.2)
    assert profile.decode.speed.anchor == pytest.approx(2.5, rel=0.02)  # 1,000 / 400 µs, before the spell
    report = fit_mape(records)
    blind = fit_mape([dataclasses.replace(r, host_probe_us=None) for r in records])
    assert report.mape_decode is not None and blind.mape_decode is not None
    assert report.mape_decode < 0.05 and blind.mape_decode > 1.5 * report.mape_decode
    # theta is at the typical speed (the spell in it), the record's probe carries it back
    assert profile.decode.theta[0] > TRUE_DECODE[0] * 1.03
    loaded = Profile.from_dict(profile.to_dict())
    assert loaded.decode.speed == profile.decode.speed
    old = profile.to_dict()
    old["decode_host"] = {k: v for k, v in old["decode_host"].items() if k != "speed"}  # type: ignore[attr-defined]
    assert Profile.from_dict(old).decode.speed.gamma == 0.0  # saved before the probe: a fresh effect


def test_a_host_slower_than_any_fitted_on_widens_the_band() -> None:
    """Fitted on a steady host, then held back through a spell 1.25x slower
    that the model never saw the probe move for: no elasticity was learned,
    so the point prediction is the blind one, but the band widens by what
    an elasticity in [0, 1] could make of the probe's distance: blind, it
    covers the normal third of the held-back steps only (0.29 here)."""
    rng = np.random.default_rng(5)
    ordered = sorted(synthetic_records(3000, seed=13, noise=0.03), key=lambda r: r.t)
    records = []
    for i, r in enumerate(ordered):
        slow = 1.25 if i / len(ordered) >= 0.8 else 1.0
        probe = 400.0 * slow * float(rng.lognormal(0.0, 0.04))
        records.append(dataclasses.replace(r, elapsed_ms=r.elapsed_ms * slow, host_probe_us=probe))
    report = fit_mape(records)
    blind = fit_mape([dataclasses.replace(r, host_probe_us=None) for r in records])
    assert report.band_decode is not None and blind.band_decode is not None
    assert report.mape_decode == pytest.approx(blind.mape_decode, rel=0.02)
    # the spell's steps sit where an elasticity of 1 puts them, the edge of what the band allows for
    assert blind.band_decode < 0.35 and report.band_decode > blind.band_decode + 0.1
