"""Restart a dead engine core inside the live worker process.

A worker process outlives its vLLM engine core (a crash in the core, an OOM
kill of that child). Relaunching the whole process costs a Python and vLLM
start on top of the engine's own; `EngineHealer` instead starts a new core
in place (`WorkerEngine.restart`): the node keeps its id, port, phase and
fence, and rejoins when its heartbeat shows the engine alive again.

Loop shape: look at the engine's state every `interval_s` (decide with the
pure `RestartBook`: restart after a backoff, or give up past the limit) ->
one restart -> record it (`restarts`, `last_restart_s`, read by /healthz and
the heartbeat). Once it gives up the engine stays dead, /healthz answers 503
`engine_dead`, and the supervisor above (`up`'s watchdog, Kubernetes'
liveness probe) relaunches the whole process.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Protocol

from workers.protocol import EngineState
from workers.restart_policy import RestartBook, RestartPolicy

log = logging.getLogger(__name__)

CAUSE = "engine core died"


class Restartable(Protocol):
    """What the healer needs of `WorkerEngine`."""

    @property
    def state(self) -> EngineState: ...
    @property
    def inflight(self) -> dict: ...
    async def restart(self) -> None: ...


@dataclass
class HealStats:
    restarts: int = 0  # engine cores restarted in place that came up
    failed_restarts: int = 0  # restarts whose new core did not start
    gave_up: bool = False  # past the policy's limit: left to the supervisor
    last_restart_s: float | None = None  # from seeing the core dead to the new one alive


class EngineHealer:
    """`policy.max_restarts == 0` turns in-place restarts off (the process
    supervisor restarts the whole worker instead)."""

    def __init__(
        self,
        engine: Restartable,
        policy: RestartPolicy = RestartPolicy(base_delay_s=0.2),
        *,
        interval_s: float = 0.1,
        drain_s: float = 2.0,
    ) -> None:
        self.engine, self.policy = engine, policy
        self.book = RestartBook(policy)
        self.interval_s, self.drain_s = interval_s, drain_s
        self.stats = HealStats()

    @property
    def will_restart(self) -> bool:
        """A dead engine here gets a new core (within the policy's limit)."""
        return self.policy.max_restarts > 0 and not self.stats.gave_up

    def state(self) -> EngineState:
        """The engine's state as this process reports it: a dead core that
        is about to be restarted in place is already `restarting`, so no
        supervisor relaunches the process meanwhile."""
        s = self.engine.state
        return EngineState.RESTARTING if s is EngineState.DEAD and self.will_restart else s

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            if self.engine.state is EngineState.DEAD and not self.stats.gave_up:
                await self.heal_once()

    async def heal_once(self) -> None:
        seen = time.monotonic()
        verdict = self.book.decide(CAUSE, time.time())
        if verdict.gave_up:
            self.stats.gave_up = True
            log.error("engine core died: %d in-place restarts in the window; left to the supervisor", verdict.attempt)
            return
        if not verdict.restart:
            return
        log.warning("engine core died: restarting it in place (restart %d in %.1f s)", verdict.attempt, verdict.delay_s)
        await asyncio.sleep(verdict.delay_s)
        # The requests that ran on the dead core end with `engine_died` on
        # their own (vLLM fails their streams); let them, before the client
        # they hold is shut down. The few vLLM leaves open end when it shuts
        # down, as `engine_died` too (`WorkerEngine.generate`).
        deadline = time.monotonic() + self.drain_s
        while self.engine.inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        try:
            await self.engine.restart()
        except Exception:  # a start that fails (any reason) leaves the engine dead; the policy decides again
            self.stats.failed_restarts += 1
            log.exception("engine restart %d failed", verdict.attempt)
            return
        self.stats.restarts += 1
        self.stats.last_restart_s = time.monotonic() - seen
        log.warning("engine core restarted in place in %.1f s", self.stats.last_restart_s)
