"""`bench._stages`: the clock times what it wraps wherever it is called from,
refuses what it cannot time, and every stage it names exists in the gateway."""

from __future__ import annotations

import inspect
import json
import os
import pathlib
import signal
import sys
import time
import types

import pytest

from bench import _stages


@pytest.fixture
def modules(monkeypatch: pytest.MonkeyPatch) -> tuple[types.ModuleType, types.ModuleType]:
    """A module with a function and a class, and one that imported the function by name."""
    a = types.ModuleType("stages_fake_a")

    def double(x: int) -> int:
        time.sleep(0.002)
        return 2 * x

    class Box:
        def inner(self) -> int:
            time.sleep(0.003)
            return 1

        def outer(self) -> int:
            return self.inner() + 1

    async def later() -> None:
        return None

    vars(a).update(double=double, Box=Box, later=later, LIMIT=3)
    b = types.ModuleType("stages_fake_b")
    vars(b).update(double=double)  # as `from stages_fake_a import double` leaves it
    monkeypatch.setitem(sys.modules, a.__name__, a)
    monkeypatch.setitem(sys.modules, b.__name__, b)
    return a, b


def test_a_function_is_timed_through_names_bound_elsewhere(modules: tuple[types.ModuleType, types.ModuleType]) -> None:
    a, b = modules
    clock = _stages.StageClock()
    clock.wrap("stages_fake_a:double")
    assert a.double(2) == 4 and b.double(3) == 6
    got = clock.snapshot()["stages_fake_a:double"]
    assert got["calls"] == 2
    assert got["seconds"] >= 0.004
    clock.reset()
    assert clock.snapshot()["stages_fake_a:double"] == {"calls": 0, "seconds": 0.0, "self_seconds": 0.0}


def test_a_stage_inside_another_counts_in_both_and_only_in_its_own_self_time(
    modules: tuple[types.ModuleType, types.ModuleType],
) -> None:
    a, _ = modules
    clock = _stages.StageClock()
    clock.wrap("stages_fake_a:Box.outer")
    clock.wrap("stages_fake_a:Box.inner")
    assert a.Box().outer() == 2
    snap = clock.snapshot()
    outer, inner = snap["stages_fake_a:Box.outer"], snap["stages_fake_a:Box.inner"]
    assert outer["calls"] == inner["calls"] == 1
    assert inner["seconds"] >= 0.003  # inner sleeps (the fixture's Box)
    assert outer["seconds"] >= inner["seconds"]
    assert outer["self_seconds"] == pytest.approx(outer["seconds"] - inner["seconds"])
    assert outer["self_seconds"] < 0.003


@pytest.mark.parametrize("spec", ["stages_fake_a:later", "stages_fake_a:LIMIT"])
def test_what_cannot_be_timed_is_refused(modules: tuple[types.ModuleType, types.ModuleType], spec: str) -> None:
    with pytest.raises(ValueError, match=spec):
        _stages.StageClock().wrap(spec)


def test_the_signals_reset_and_write_the_totals(
    modules: tuple[types.ModuleType, types.ModuleType], tmp_path: pathlib.Path
) -> None:
    a, _ = modules
    out = tmp_path / "stages.json"
    before = {sig: signal.getsignal(sig) for sig in (_stages.RESET, _stages.DUMP)}
    try:
        _stages.install(str(out), ["stages_fake_a:double"])
        a.double(1)
        os.kill(os.getpid(), _stages.RESET)
        a.double(1)
        os.kill(os.getpid(), _stages.DUMP)
        assert json.loads(out.read_text())["stages_fake_a:double"]["calls"] == 1
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def test_per_request_figures() -> None:
    snapshot = {
        "m:ChatRenderer.render": {"calls": 100, "seconds": 0.008, "self_seconds": 0.005},
        "m:ChatRenderer.conversation": {"calls": 100, "seconds": 0.003, "self_seconds": 0.003},
        "m:route": {"calls": 200, "seconds": 0.002, "self_seconds": 0.002},
    }
    got = _stages.per_request(snapshot, 100, 400.0)
    render = {"us_per_request": 80.0, "self_us_per_request": 50.0, "calls_per_request": 1.0}
    assert got["stages"]["ChatRenderer.render"] == render
    assert got["stages"]["route"] == {"us_per_request": 20.0, "self_us_per_request": 20.0, "calls_per_request": 2.0}
    assert got["timed_share"] == 0.25  # (50 + 30 + 20) / 400: self times, nothing counted twice


@pytest.mark.parametrize("spec", _stages.STAGES)
def test_every_named_stage_is_a_synchronous_gateway_function(spec: str) -> None:
    _, _, fn = _stages.resolve(spec)
    assert inspect.isfunction(fn) and not inspect.iscoroutinefunction(fn), spec
