"""Run log and summary metrics of one simulation.

Definitions (over requests *finished* before the horizon unless said):
- throughput_rps: finished requests (agent turns) / horizon;
  output_tokens_per_s likewise for output tokens.
- e2e: finish - arrival; ttft: first token - arrival (a closed-loop turn
  arrives when its tool call returns).
- completed / arrived: finished requests over requests that arrived before
  the horizon (`completed_fraction`); a planner that finishes fewer cannot
  hide it behind faster means.
- mean_e2e_all_s / p95_e2e_all_s: over *every* arrived request, an
  unfinished one counted as horizon - arrival (a lower bound of its E2E).
- served: how many of the requests that arrived by H - `slack_s` finished
  by the horizon H (slack: min(300 s, H / 6)); a count, not a rate.
  Near the horizon "finished by H" depends on which requests happen to
  straddle it: on a light load two planners that both serve every request
  differ by a few of them. Requests that arrived `slack_s` before the end
  had time to finish on any split that keeps up, so at a load every split
  serves this is the same for all of them, and in overload (a queue of
  minutes: what finishes arrived long before) it mostly moves with the
  throughput. Not always: where cheap requests (prompts the prefix cache
  holds, which wait in no prefill queue) arrive late and finish early, a
  split that serves them sooner finishes more in all and fewer of the
  early arrivals. On Mooncake's synthetic trace at 3x overload (`simulate
  --suite`, perturbation overload_3x) the planner, at 7P2D from its first
  tick, finished 3.3 % more requests than the static 8P1D, at 30x its
  goodput (20.4 against 0.66 req/s), and served 3.1 % fewer. `simulate
  --suite` compares planners by it and reports the throughput ratio beside.
- goodput_rps: finished requests that met the SLO (TTFT <= slo.ttft_s and
  mean time per output token after the first <= slo.tpot_s) / horizon.
- flaps: moves (one tick's switches, net) back to the split the move
  before them left, less than `flap_window_s` after it (`count_flaps`); an
  overshoot corrected to a third split is not one, nor is a revert (the
  planner measured that the move did not deliver, `planner.verification`:
  `reverted_moves` counts those apart).
- verified_moves / delivered_moves / reverted_moves: model moves the
  planner checked once settled, those that delivered what it predicted
  (within its uncertainty), those it reverted; `move_checks` lists each
  (t of the move, from, to, predicted, realized gain fraction, reverted).
- prefill_idle_fraction: 1 - (prefill compute time) / (time nodes spent
  serving in the prefill phase); layer-by-layer KV stalls count as idle.
- switches: switches started; split_over_time: (t, prefill, decode, other)
  with other = draining or offline nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from core import Phase
from sim.state import SimRequest

if TYPE_CHECKING:
    from sim.node import SimNode
    from sim.switching import SwitchEvent


def count_flaps(moves: list[tuple[float, int, int]], window_s: float, reverts: Iterable[float] = ()) -> int:
    """Moves (time, prefill nodes before, after) -> how many went back to the
    split the move before them left, less than `window_s` after it; moves
    made at a time in `reverts` (verified reverts) are not counted."""
    flaps, skip = 0, set(reverts)
    for (t0, before0, _), (t1, _, after1) in zip(moves, moves[1:], strict=False):
        if after1 == before0 and t1 - t0 < window_s and t1 not in skip:
            flaps += 1
    return flaps


def split_moves(switch_events: list[Any], initial_prefill: int) -> list[tuple[float, int, int]]:
    """One move per tick that switched nodes: (time, prefill nodes before, after)."""
    net: dict[float, int] = {}
    for e in switch_events:
        net[e.t] = net.get(e.t, 0) + (1 if e.to_phase is Phase.PREFILL else -1)
    moves, p = [], initial_prefill
    for t, d in sorted(net.items()):
        if d:
            moves.append((t, p, p + d))
            p += d
    return moves


class RunLog:
    def __init__(self, *, ttft_slo_s: float = 2.0, tpot_slo_s: float = 0.2, flap_window_s: float = 600.0) -> None:
        self.ttft_slo_s, self.tpot_slo_s, self.flap_window_s = ttft_slo_s, tpot_slo_s, flap_window_s
        self.unfinished_arrivals: list[float] = []  # arrival times of requests still running at the horizon
        self.arrived = 0
        self.decisions = 0
        self.rows: list[tuple[float, float, float, int, int, int]] = []  # arrival, ttft_t, finish, prompt, out, migr
        self.split: list[tuple[float, int, int, int]] = []
        self.horizon = 0.0
        self.prefill_compute_s = 0.0
        self.prefill_stall_s = 0.0
        self.prefill_phase_s = 0.0
        self.switch_events: list[Any] = []
        self.events_processed = 0
        self.reverts: list[float] = []  # ticks at which the planner reverted a move it checked
        self.move_checks: list[list[float]] = []  # [move t, from, to, predicted, realized, reverted]

    def done(self, sr: SimRequest) -> None:
        assert sr.finish is not None  # called when the request finishes
        ft = sr.first_token if sr.first_token is not None else sr.finish
        self.rows.append(
            (
                sr.arrival,
                ft,
                sr.finish,
                sr.req.prompt_tokens,
                sr.req.output_tokens,
                sr.migrations,
            )
        )

    def finish(
        self, nodes: Iterable[SimNode], switch_events: list[SwitchEvent], events_processed: int, horizon: float
    ) -> None:
        self.horizon = horizon
        for n in nodes:
            self.prefill_compute_s += n.prefill.compute_s
            self.prefill_stall_s += n.prefill.stall_s
            self.prefill_phase_s += n.prefill_phase_s
        self.switch_events = list(switch_events)
        self.events_processed = events_processed

    def slack_s(self) -> float:
        return min(300.0, self.horizon / 6.0)

    def served(self, rows: np.ndarray) -> int:
        """`served` (module doc) over `rows` (the log's, as an array)."""
        cut = self.horizon - self.slack_s()
        return int(np.count_nonzero(rows[:, 0] <= cut)) if len(rows) else 0

    def summary(self, window_s: float = 300.0, max_points: int = 240) -> dict[str, Any]:
        a = np.array(self.rows, dtype=float).reshape(-1, 6)
        e2e, ttft = a[:, 2] - a[:, 0], a[:, 1] - a[:, 0]
        h = max(self.horizon, 1e-9)
        e2e_all = np.concatenate([e2e, self.horizon - np.asarray(self.unfinished_arrivals, dtype=float)])
        with np.errstate(divide="ignore", invalid="ignore"):
            tpot = np.where(a[:, 4] > 1, (a[:, 2] - a[:, 1]) / np.maximum(a[:, 4] - 1, 1), 0.0)
        good = int(np.count_nonzero((ttft <= self.ttft_slo_s) & (tpot <= self.tpot_slo_s)))
        moves = split_moves(self.switch_events, self.split[0][1] if self.split else 0)

        def stat(x: np.ndarray, f: Callable[[np.ndarray], Any]) -> float:
            return round(float(f(x)), 4) if len(x) else 0.0

        edges = np.arange(0.0, h + window_s, window_s)
        done_w = np.histogram(a[:, 2], bins=edges)[0] if len(a) else np.zeros(len(edges) - 1)
        ttft_w = []
        for lo, hi in zip(edges[:-1], edges[1:], strict=False):
            m = (a[:, 0] >= lo) & (a[:, 0] < hi)
            ttft_w.append(round(float(np.percentile(ttft[m], 95)), 3) if m.any() else None)
        step = max(1, len(self.split) // max_points)
        split = [[round(t, 1), p, d, o] for t, p, d, o in self.split[::step]]
        total = [e.total_s for e in self.switch_events if e.total_s > 0]
        busy = self.prefill_phase_s
        return {
            "completed": len(a),
            "arrived": self.arrived,
            "completed_fraction": round(len(a) / self.arrived, 4) if self.arrived else None,
            "throughput_rps": round(len(a) / h, 4),
            "served": self.served(a),
            "goodput_rps": round(good / h, 4),
            "output_tokens_per_s": round(float(a[:, 4].sum()) / h, 1) if len(a) else 0.0,
            "mean_e2e_s": stat(e2e, np.mean),
            "p95_e2e_s": stat(e2e, lambda x: np.percentile(x, 95)),
            "mean_e2e_all_s": stat(e2e_all, np.mean),
            "p95_e2e_all_s": stat(e2e_all, lambda x: np.percentile(x, 95)),
            "mean_ttft_s": stat(ttft, np.mean),
            "p95_ttft_s": stat(ttft, lambda x: np.percentile(x, 95)),
            "switches": len(self.switch_events),
            "moves": len(moves),
            "flaps": count_flaps(moves, self.flap_window_s, self.reverts),
            "verified_moves": len(self.move_checks),
            "delivered_moves": sum(1 for c in self.move_checks if c[6]),
            "reverted_moves": len(self.reverts),
            "move_checks": [c[:6] for c in self.move_checks],
            "mean_switch_s": round(float(np.mean(total)), 2) if total else 0.0,
            "migrated_requests": int(a[:, 5].sum()) if len(a) else 0,
            "prefill_idle_fraction": round(1.0 - self.prefill_compute_s / busy, 4) if busy > 0 else None,
            "min_prefill_nodes": min((p for _, p, _, _ in self.split), default=0),
            "p95_ttft_by_window_s": ttft_w,
            "throughput_by_window_rps": [round(float(x) / window_s, 4) for x in done_w],
            "window_s": window_s,
            "split_over_time": split,
        }
