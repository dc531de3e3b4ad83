"""What shares a worker's cores: its engine's CPU share, from the kernel.

Linux keeps, per thread, the nanoseconds it ran and the nanoseconds it sat
runnable on a run queue waiting for a core (`/proc/<pid>/task/<tid>/schedstat`,
fields 1 and 2). Over an interval, ``ran / (ran + waited)`` summed over the
engine process's threads is the share of the CPU it got while it wanted it:
1 when nothing else competed for its cores, 0.5 when another busy process
took turns with it. A step that needed C CPU-seconds at share s takes C / s
wall seconds, which is the scatter of decode steps on a shared host.

A background thread samples the cumulative counters; `share` interpolates
them over a step's interval. Reading /proc is Linux only; elsewhere the
sampler finds no engine and every share is None.
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from pathlib import Path

ENGINE_COMM = "VLLM::EngineCor"  # vLLM's engine-core process name (15-char comm)


def engine_pids(group: int) -> list[int]:
    """Pids of vLLM engine-core processes in process group ``group``."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        if comm == ENGINE_COMM and int(fields[2]) == group:
            out.append(int(entry.name))
    return out


def read_schedstat(pids: list[int]) -> tuple[int, int]:
    """(ran_ns, waited_ns) summed over every thread of ``pids``."""
    ran = waited = 0
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                fields = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()
            except OSError:
                continue  # the thread ended between listing and reading
            ran += int(fields[0])
            waited += int(fields[1])
    return ran, waited


class ShareSampler:
    """Samples one process group's engine counters every ``period_s``."""

    def __init__(self, group: int, period_s: float = 0.02) -> None:
        self.group = group
        self.period_s = period_s
        self.t: list[float] = []
        self.ran: list[int] = []
        self.waited: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> ShareSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        pids: list[int] = []
        while not self._stop.is_set():
            pids = pids or engine_pids(self.group)
            if pids:
                ran, waited = read_schedstat(pids)
                self.t.append(time.time())
                self.ran.append(ran)
                self.waited.append(waited)
            self._stop.wait(self.period_s)

    def share(self, start: float, end: float) -> float | None:
        """The engine's CPU share over [start, end], widened to the samples
        around it; None without samples on both sides."""
        return share_between(self.t, self.ran, self.waited, start, end)


def share_between(t: list[float], ran: list[int], waited: list[int], start: float, end: float) -> float | None:
    """``ran / (ran + waited)`` between the last sample at or before ``start``
    and the first at or after ``end`` (pure; samples sorted by time). 1.0 when
    the engine neither ran nor waited then."""
    i = bisect.bisect_right(t, start) - 1
    j = bisect.bisect_left(t, end)
    if i < 0 or j >= len(t) or j <= i:
        return None
    d_ran, d_wait = ran[j] - ran[i], waited[j] - waited[i]
    if d_ran + d_wait <= 0:
        return 1.0
    return d_ran / (d_ran + d_wait)
