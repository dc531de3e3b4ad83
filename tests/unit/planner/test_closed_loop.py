"""The closed loop's throughput (`planner._split_math.served`) is the value
of its bisection to the bit, with fewer evaluations of the response time."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import planner._split_math as split_math
from planner.estimator_config import EstimatorConfig
from planner.profile import Profile
from planner.workload import WorkloadEstimate


def bisection(sc: dict[str, np.ndarray], fx: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The definition `served` must reproduce: `_BISECT` plain bisection steps,
    each evaluating R at every element, then R at the result."""
    cap, w = fx["cap"], sc["w"]
    cols = (split_math._RATE, split_math._CF, split_math._Z, split_math._R)
    demand, cf, think, resp = (w[:, i : i + 1] for i in cols)
    open_rate = np.minimum(demand * (1.0 - cf), cap)
    agents = demand * cf * (think + resp)
    room = np.maximum(cap - open_rate, 0.0)
    hi = np.where(think > 0, np.minimum(room, agents / np.maximum(think, split_math._EPS)), room)
    hi = np.where(agents > 0, hi, 0.0)
    lo = np.zeros_like(hi)
    for _ in range(split_math._BISECT):
        mid = (lo + hi) / 2.0
        short = mid * (think + split_math._e2e_at_rate(fx, open_rate + mid)) < agents
        lo, hi = np.where(short, mid, lo), np.where(short, hi, mid)
    x = open_rate + lo
    return x, split_math._e2e_at_rate(fx, x)


def _workload(rate: float, closed: float, think: float, local: float, output: float) -> WorkloadEstimate:
    u, c = 3000.0, 9000.0
    return WorkloadEstimate(
        window_s=60.0,
        n=400,
        rate_rps=rate,
        uncached_mean=u,
        uncached_std=1500.0,
        cached_mean=c,
        cached_std=4000.0,
        output_mean=output,
        output_std=output * 0.8,
        local_fraction=local,
        n_remote=int(400 * (1 - local)),
        remote_uncached_mean=u,
        remote_uncached_std=1500.0,
        remote_cached_mean=c,
        remote_cached_std=4000.0,
        local_uncached_mean=200.0,
        local_cached_mean=11000.0,
        closed_fraction=closed,
        think_mean_s=think,
        response_mean_s=6.0,
    )


# Prefill t = 15 + 0.05·uncached + 1e-6·cached ms; decode t = 8 + 0.2·batch + 2e-5·context ms.
PROFILE = Profile.from_coefficients((15.0, 0.05, 1e-6, 0.0), (8.0, 0.2, 2e-5))
CONFIG = EstimatorConfig()
CASES = list(
    itertools.product(
        (16, 64),  # nodes
        (0.3, 3.0, 30.0, 300.0),  # requests/s: light to far past every split's capacity
        (0.5, 1.0),  # closed fraction
        (0.0, 4.0),  # think time (s)
        (0.0, 0.4),  # local fraction
        (80.0, 900.0),  # output tokens
    )
)


def _inputs(nodes: int, rate: float, closed: float, think: float, local: float, output: float):
    w = _workload(rate, closed, think, local, output)
    sc = split_math.scenarios(PROFILE, [w], True, CONFIG.prefill_token_budget)
    fx = split_math.fixed_terms(sc, np.arange(nodes + 1), nodes, 2e6, CONFIG)
    return sc, fx


@pytest.mark.parametrize(("nodes", "rate", "closed", "think", "local", "output"), CASES)
def test_served_is_the_bisection_to_the_bit(
    nodes: int, rate: float, closed: float, think: float, local: float, output: float
) -> None:
    sc, fx = _inputs(nodes, rate, closed, think, local, output)
    x, r = split_math.served(sc, fx)
    x_ref, r_ref = bisection(sc, fx)
    assert np.array_equal(x, x_ref)
    assert np.array_equal(r, r_ref)


@pytest.mark.parametrize("rounds", [0, 1])
def test_failed_checks_fall_back_to_the_bisection(monkeypatch: pytest.MonkeyPatch, rounds: int) -> None:
    """With fewer rounds of checked paths, more elements take plain steps: the same bits."""
    monkeypatch.setattr(split_math, "_ROUNDS", rounds)
    for case in CASES[::7]:
        sc, fx = _inputs(*case)
        x, r = split_math.served(sc, fx)
        x_ref, r_ref = bisection(sc, fx)
        assert np.array_equal(x, x_ref)
        assert np.array_equal(r, r_ref)


@pytest.mark.parametrize("loads", [(3.0,), (0.3, 30.0, 300.0)])
def test_served_without_uncertainty_rows_is_the_bisection(loads: tuple[float, ...]) -> None:
    """One row per workload (the persistence sub-windows' `estimate_many`): J × 1 terms are 1 × 1 at J = 1."""
    ws = [_workload(rate, 1.0, 4.0, 0.4, 900.0) for rate in loads]
    sc = split_math.scenarios(PROFILE, ws, False, CONFIG.prefill_token_budget)
    fx = split_math.fixed_terms(sc, np.arange(17), 16, 2e6, CONFIG)
    x, r = split_math.served(sc, fx)
    x_ref, r_ref = bisection(sc, fx)
    assert x.shape == (len(loads), 17)
    assert np.array_equal(x, x_ref)
    assert np.array_equal(r, r_ref)


def test_served_evaluates_less_than_half_of_the_bisection(monkeypatch: pytest.MonkeyPatch) -> None:
    """Elements at which R is evaluated, over every case: the bisection's
    17 per element against ~6 (the path checks that fail go on alone)."""
    evaluated = []
    inner = split_math._e2e_at_rate

    def counted(fx: dict[str, np.ndarray], lam: np.ndarray) -> np.ndarray:
        evaluated.append(lam.size)
        return inner(fx, lam)

    monkeypatch.setattr(split_math, "_e2e_at_rate", counted)
    plain = 0
    for case in CASES:
        sc, fx = _inputs(*case)
        split_math.served(sc, fx)
        plain += (split_math._BISECT + 1) * fx["cap"].size
    assert sum(evaluated) < 0.5 * plain


def test_no_agents_is_the_open_rate() -> None:
    sc, fx = _inputs(16, 3.0, 0.0, 4.0, 0.0, 80.0)
    x, r = split_math.served(sc, fx)
    assert np.array_equal(x, np.minimum(sc["w"][:, split_math._RATE : split_math._RATE + 1], fx["cap"]))
    x_ref, r_ref = bisection(sc, fx)
    assert np.array_equal(x, x_ref)
    assert np.array_equal(r, r_ref)
