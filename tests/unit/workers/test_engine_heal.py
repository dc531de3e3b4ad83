"""The in-place engine restart rule (workers.engine_heal) over a fake engine."""

from __future__ import annotations

import asyncio

from testing.fake_engine import FakeRestartableEngine
from workers.engine_heal import EngineHealer
from workers.protocol import EngineState
from workers.restart_policy import RestartPolicy


def run(coro):
    return asyncio.run(coro)


def test_a_dead_engine_is_restarted_and_reported_restarting_meanwhile():
    async def go():
        eng = FakeRestartableEngine(start_s=0.05)
        healer = EngineHealer(eng, RestartPolicy(base_delay_s=0.0), interval_s=0.01)
        assert healer.state() is EngineState.ALIVE
        task = asyncio.create_task(healer.run())
        await asyncio.sleep(0.02)
        eng.die()
        # Dead, not yet picked up: already `restarting`, so no supervisor relaunches the process.
        assert healer.state() is EngineState.RESTARTING
        for _ in range(100):
            await asyncio.sleep(0.01)
            if eng.state is EngineState.ALIVE:
                break
        task.cancel()
        return eng, healer

    eng, healer = run(go())
    assert eng.state is EngineState.ALIVE and eng.restart_calls == 1
    assert healer.stats.restarts == 1 and healer.stats.failed_restarts == 0
    assert healer.stats.last_restart_s is not None and healer.stats.last_restart_s >= 0.05


def test_it_waits_for_the_dead_engines_requests_to_end_first():
    async def go():
        eng = FakeRestartableEngine()
        eng.inflight["r1"] = object()
        healer = EngineHealer(eng, RestartPolicy(base_delay_s=0.0), drain_s=5.0)
        eng.die()
        heal = asyncio.create_task(healer.heal_once())
        await asyncio.sleep(0.05)
        assert eng.restart_calls == 0  # r1 still ends on the dead engine
        eng.inflight.clear()
        await heal
        return eng

    assert run(go()).inflight_at_restart == [0]


def test_failed_starts_count_and_past_the_limit_it_gives_up_as_dead():
    async def go():
        eng = FakeRestartableEngine(fail_starts=5)
        healer = EngineHealer(eng, RestartPolicy(base_delay_s=0.0, max_restarts=2))
        eng.die()
        for _ in range(3):
            await healer.heal_once()
        return eng, healer

    eng, healer = run(go())
    assert eng.restart_calls == 2 and healer.stats.failed_restarts == 2
    assert healer.stats.gave_up is True
    assert healer.state() is EngineState.DEAD  # /healthz 503: the process supervisor takes over


def test_zero_restarts_means_never_restarting():
    eng = FakeRestartableEngine()
    healer = EngineHealer(eng, RestartPolicy(max_restarts=0))
    eng.die()
    assert healer.will_restart is False and healer.state() is EngineState.DEAD
