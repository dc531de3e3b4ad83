"""Iteration records with the wall time a busy engine spends per step.

Workers time each step around its forward pass (`IterationRecord.elapsed_ms`).
A busy engine also schedules, turns outputs into tokens and streams them
between two forward passes, and on a small model that is most of the step:
on the demo workers a decode step at batch 8 computes for 2.4 ms but comes
every 7.3 ms (docs/benchmarks-history.md, bench demo). What a node can serve —
the planner's capacity, TPOT and response-time predictions — follows the
cadence, not the forward pass alone.

`StepCadence.apply` rewrites each record that follows the node's
previous step back to back (its start within `max_gap_ms` of the previous
end: the engine had work waiting) to last from the previous step's end to
its own end. A record after a longer gap (the engine was idle, waiting for
requests) keeps its forward-pass time. Pure apart from the last end time it
keeps per node between calls.

`coalesce_decode_steps` then averages runs of consecutive decode steps of
one node at the same batch size into one record each (as the simulator's
records are): a busy decode node reports a step every few milliseconds, so
the regression's memory (`RLSConfig.forgetting`, about 1,000 records) would
otherwise span seconds of one batch size and extrapolate to the others
(negative slopes, negative predicted step times); averaged, it spans
minutes and the step-time noise shrinks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field

from planner.types import IterationRecord


@dataclass
class StepCadence:
    """max_gap_ms: the longest pause between two steps still counted as the
    engine's own per-step work (≥ 0); longer pauses are idle time."""

    max_gap_ms: float = 20.0
    _last_end: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_gap_ms < 0:
            raise ValueError("max_gap_ms must be >= 0")

    def apply(self, records: Iterable[IterationRecord]) -> list[IterationRecord]:
        """The records (each node's in time order) with busy steps' wall time."""
        out = []
        for r in sorted(records, key=lambda r: (r.node_id, r.t)):
            prev = self._last_end.get(r.node_id)
            if prev is not None and r.t > prev:
                gap_ms = (r.t - prev) * 1000.0 - r.elapsed_ms
                if gap_ms <= self.max_gap_ms:
                    r = dataclasses.replace(r, elapsed_ms=r.elapsed_ms + max(gap_ms, 0.0))
            self._last_end[r.node_id] = max(r.t, prev or r.t)
            out.append(r)
        return sorted(out, key=lambda r: r.t)

    def forget(self, node_id: str) -> None:
        """Drop a node's last step (it restarted or left)."""
        self._last_end.pop(node_id, None)


def _is_decode(r: IterationRecord) -> bool:
    return r.uncached_prompt_tokens == 0 and r.batch_size > 0


def coalesce_decode_steps(records: Iterable[IterationRecord], max_steps: int = 32) -> list[IterationRecord]:
    """Runs (up to `max_steps`) of one node's consecutive decode steps at one
    batch size -> one record: mean step time, context and CPU share (over the
    steps that report one), summed tokens, the run's last end time. Other
    records pass unchanged; output in time order."""
    if max_steps < 1:
        raise ValueError("max_steps must be >= 1")
    out: list[IterationRecord] = []
    by_node: dict[str, list[IterationRecord]] = {}
    for r in sorted(records, key=lambda r: r.t):
        by_node.setdefault(r.node_id, []).append(r)
    for rows in by_node.values():
        run: list[IterationRecord] = []
        for r in rows:
            if run and (not _is_decode(r) or r.batch_size != run[0].batch_size or len(run) >= max_steps):
                out.append(_merge(run))
                run = []
            if _is_decode(r):
                run.append(r)
            else:
                out.append(r)
        if run:
            out.append(_merge(run))
    return sorted(out, key=lambda r: r.t)


def _merge(run: list[IterationRecord]) -> IterationRecord:
    if len(run) == 1:
        return run[0]
    n = len(run)
    shares = [r.cpu_share for r in run if r.cpu_share is not None]
    probes = [r.host_probe_us for r in run if r.host_probe_us is not None]
    return dataclasses.replace(
        run[-1],
        generated_tokens=sum(r.generated_tokens for r in run),
        context_tokens=round(sum(r.context_tokens for r in run) / n),
        elapsed_ms=sum(r.elapsed_ms for r in run) / n,
        cpu_share=sum(shares) / len(shares) if shares else None,  # the mean step ran at the run's mean share
        host_probe_us=sum(probes) / len(probes) if probes else None,  # ... and the run's mean host speed
    )
