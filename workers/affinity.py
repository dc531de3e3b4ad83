"""Keep a worker's HTTP side off the cores its engine computes on.

On a CPU node vLLM binds the engine's compute threads to the cores in
`VLLM_CPU_OMP_THREADS_BIND`; the worker's own process (asyncio loop, HTTP,
output handling) is otherwise free to land on those cores and preempt a
forward pass mid-step. Once the engine has started, the worker can move all of
its own threads to other cores when asked (`--http-cpus auto|LIST`), which
steadies step times when one worker computes at a time. It is off by
default: with two workers on two cores, "the other core" is the other
engine's, and a busy neighbour then starves this worker's output handling
(both measured in docs/benchmarks-history.md).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


def parse_cpu_list(spec: str) -> set[int]:
    """CPUs named by a bind spec: "0", "0-3", "0,2,5-7"; "|" separates
    per-rank lists (all are included). Raises ValueError on anything else."""
    cpus: set[int] = set()
    for part in spec.replace("|", ",").split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise ValueError(f"bad CPU list {spec!r}: expected forms like 0, 0-3 or 0,2,5-7") from None
        if first < 0 or last < first:
            raise ValueError(f"bad CPU range {part!r} in {spec!r}")
        cpus.update(range(first, last + 1))
    if not cpus:
        raise ValueError(f"no CPUs in {spec!r}")
    return cpus


def engine_cpus(threads_bind: str | None) -> set[int] | None:
    """The cores a bind spec names; None for none, vLLM's `auto`/`nobind`, or
    a spec only vLLM understands (it validates its own)."""
    if not threads_bind or threads_bind.strip() in ("auto", "nobind"):
        return None
    try:
        return parse_cpu_list(threads_bind)
    except ValueError:
        return None


def http_side_cpus(spec: str | None, threads_bind: str | None, available: set[int]) -> set[int] | None:
    """The cores the worker's own threads should use, or None to leave them.

    spec: None/"none" (leave them), "auto" (every available core outside the
    engine's bind; nothing when the bind is missing, `auto`/`nobind` or
    covers them all) or an explicit list ("2-3"). Only "auto" and lists
    change anything: where several workers share a machine, the cores outside
    one engine's bind may be another engine's, and pinning there would move
    the contention, not remove it.
    """
    if spec is None or spec == "none":
        return None
    if spec != "auto":
        return (parse_cpu_list(spec) & available) or None
    engine = engine_cpus(threads_bind)
    if not engine:
        return None
    return (available - engine) or None


def pin_own_threads(cpus: set[int]) -> int:
    """Move every thread of this process to `cpus`; returns how many moved.
    Threads started later inherit the mask of the thread that starts them."""
    moved = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
            moved += 1
        except OSError:  # a thread that ended meanwhile
            continue
    return moved


@contextlib.contextmanager
def spawning_on(cpus: set[int] | None) -> Iterator[None]:
    """Processes (and threads) this thread starts inside the block inherit
    `cpus` as their mask; afterwards every thread of this process gets the
    mask it had before back (threads started meanwhile included). None: no-op."""
    if not cpus:
        yield
        return
    own = os.sched_getaffinity(0)
    if not cpus <= own:
        raise ValueError(f"CPUs {sorted(cpus - own)} are outside this process's {sorted(own)}")
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        pin_own_threads(own)
