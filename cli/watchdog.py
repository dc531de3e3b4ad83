"""`up` restarts a worker whose process exited or whose engine died.

A worker restarts its own dead engine core in place (`workers.engine_heal`;
/healthz says `restarting`, then counts it in `engine_restarts`): the
watchdog records each such restart as an event and relaunches the process
only when it exited, or when its /healthz says `engine_dead` (the worker
gave up restarting in place, or was started with `--engine-restarts 0`).

Pure part: `RestartPolicy` (exponential backoff, a retry limit within a
window) and `RestartBook.decide` (`workers.restart_policy`), which turn one
look at a worker into "leave it", "restart after d seconds" or "give up".
Shell: `WorkerWatchdog`,
a thread that every `interval_s` polls each worker's process and /healthz
(decide), stops and restarts the process group (one I/O step) and reports
the restart through `on_event` (apply: `up` writes an entry in the switch
history and the audit log; the gateway's registry counts it as a metric
when the node's heartbeat shows a new process).

A restarted worker comes back in the phase it last reported (the planner's
choice for it, or a pin's), read from /internal/phase while it was healthy.
"""

from __future__ import annotations

import logging
import pathlib
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import httpx

from workers.restart_policy import RestartBook, RestartPolicy, Verdict

log = logging.getLogger(__name__)


class ProcessGroup(Protocol):
    """The processes the watchdog looks after, by name (`cli.supervisor.Children`)."""

    def get(self, name: str) -> subprocess.Popen[bytes] | None: ...
    def stop(self, grace_s: float = 10.0, names: Sequence[str] | None = None) -> None: ...
    def start(self, name: str, argv: list[str], log: pathlib.Path, env: dict[str, str] | None = None) -> None: ...


@dataclass
class WorkerSpec:
    name: str  # the child's name in `Children`, also its node id
    url: str
    argv: list[str]  # its command line; "--phase" is rewritten to the phase it last had
    log: pathlib.Path
    env: dict[str, str] | None = None
    phase: str = "decode"
    engine_restarts: int = 0  # in-place engine restarts its current process reported (/healthz)
    pid: int | None = None  # the process `engine_restarts` belongs to


@dataclass(frozen=True)
class RestartEvent:
    node_id: str
    cause: str
    phase: str
    attempt: int
    delay_s: float
    gave_up: bool = False
    in_place: bool = False  # the worker restarted its engine core itself; the process lives on


def down_cause(exit_code: int | None, healthz_status: int | None, healthz_type: str) -> str | None:
    """Why a worker needs a restart, from its process and its /healthz (None: it does not).

    A /healthz that does not answer is not a cause on its own: a busy worker
    may be slow; a gone process shows in its exit code."""
    if exit_code is not None:
        return f"process exited with status {exit_code}"
    if healthz_status == 503 and healthz_type == "engine_dead":
        return "engine core died"
    return None


class WorkerWatchdog(threading.Thread):
    def __init__(
        self,
        children: ProcessGroup,
        specs: list[WorkerSpec],
        *,
        policy: RestartPolicy = RestartPolicy(),
        on_event: Callable[[RestartEvent], None] = lambda e: None,
        interval_s: float = 0.5,
    ) -> None:
        super().__init__(name="worker-watchdog", daemon=True)
        self.children, self.specs, self.policy = children, {s.name: s for s in specs}, policy
        self.books = {s.name: RestartBook(policy) for s in specs}
        self.on_event, self.interval_s = on_event, interval_s
        self.halt = threading.Event()
        self._http = httpx.Client(timeout=2.0)

    def run(self) -> None:
        try:
            while not self.halt.wait(self.interval_s):
                for spec in self.specs.values():
                    if self.halt.is_set():
                        return
                    self._check(spec)
        finally:
            self._http.close()

    def _look(self, spec: WorkerSpec) -> str | None:
        proc = self.children.get(spec.name)
        code = None if proc is None else proc.poll()
        status, kind = None, ""
        if code is None:
            try:
                r = self._http.get(f"{spec.url}/healthz")
                status = r.status_code
                if status == 503:
                    kind = r.json().get("error", {}).get("type", "")
                elif status == 200:
                    self._note_in_place(spec, int(r.json().get("engine_restarts", 0)), proc.pid if proc else None)
                    ph = self._http.get(f"{spec.url}/internal/phase")
                    if ph.status_code == 200:
                        spec.phase = ph.json().get("draining_to") or ph.json().get("phase", spec.phase)
            except (httpx.HTTPError, ValueError):
                pass
        return down_cause(code, status, kind)

    def _note_in_place(self, spec: WorkerSpec, restarts: int, pid: int | None) -> None:
        """Report the engine restarts the worker did itself since the last look.

        The count is per process: whoever relaunched it (this watchdog, an
        operator, the bench), a new pid counts from 0 again, so its first
        in-place restart is reported, not hidden under the old process's count."""
        if pid != spec.pid:
            spec.pid, spec.engine_restarts = pid, 0
        for n in range(spec.engine_restarts + 1, restarts + 1):
            log.warning("worker %s restarted its engine core in place (restart %d)", spec.name, n)
            self.on_event(RestartEvent(spec.name, "engine core died", spec.phase, n, 0.0, in_place=True))
        spec.engine_restarts = max(spec.engine_restarts, restarts)

    def _check(self, spec: WorkerSpec) -> None:
        cause = self._look(spec)
        verdict = self.books[spec.name].decide(cause, time.time())
        if verdict.gave_up:
            log.error("worker %s down (%s): %d restarts in the window, giving up", spec.name, cause, verdict.attempt)
            self.on_event(RestartEvent(spec.name, cause or "", spec.phase, verdict.attempt, 0.0, gave_up=True))
            return
        if not verdict.restart:
            return
        assert cause is not None
        log.warning("worker %s down (%s): restart %d in %.1f s", spec.name, cause, verdict.attempt, verdict.delay_s)
        self.children.stop(grace_s=5.0, names=[spec.name])
        if self.halt.wait(verdict.delay_s):
            return
        self.children.start(spec.name, with_phase(spec.argv, spec.phase), spec.log, spec.env)
        self.on_event(RestartEvent(spec.name, cause, spec.phase, verdict.attempt, verdict.delay_s))

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=10.0)


def with_phase(argv: list[str], phase: str) -> list[str]:
    """`argv` with its "--phase" value replaced (added when absent)."""
    out = list(argv)
    if "--phase" in out:
        out[out.index("--phase") + 1] = phase
    else:
        out += ["--phase", phase]
    return out


__all__ = [
    "ProcessGroup",
    "RestartEvent",
    "RestartPolicy",
    "RestartBook",
    "Verdict",
    "WorkerSpec",
    "WorkerWatchdog",
    "down_cause",
    "with_phase",
]
