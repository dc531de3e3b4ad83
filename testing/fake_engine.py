"""A fake `WorkerEngine` for unit tests of the engine healer (no vLLM).

`FakeRestartableEngine` has the state, the in-flight table and `restart`
of `workers.engine_heal.Restartable`; `die()` makes it dead, `fail_starts`
makes that many restarts raise, as a new engine core that cannot start."""

from __future__ import annotations

import asyncio

from workers.protocol import EngineState


class FakeRestartableEngine:
    def __init__(self, *, fail_starts: int = 0, start_s: float = 0.0) -> None:
        self.state = EngineState.ALIVE
        self.inflight: dict[str, object] = {}
        self.fail_starts, self.start_s = fail_starts, start_s
        self.restart_calls = 0
        self.inflight_at_restart: list[int] = []

    def die(self) -> None:
        self.state = EngineState.DEAD

    async def restart(self) -> None:
        self.restart_calls += 1
        self.inflight_at_restart.append(len(self.inflight))
        self.state = EngineState.RESTARTING
        await asyncio.sleep(self.start_s)
        if self.fail_starts:
            self.fail_starts -= 1
            self.state = EngineState.DEAD
            raise RuntimeError("the fake engine core did not start")
        self.state = EngineState.ALIVE
