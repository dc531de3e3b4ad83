"""GPU node profiles: JSON files in sim/gpu_profiles -> iteration models.

`GpuProfile.from_json(path)` reads coefficients (with a per-number `source`);
`.planner_profile()` gives the planner's `planner.profile.Profile`;
`.iteration_model()` gives a fast float-only model with the same formulas
for the simulator's inner loop (the planner's RLS predict is vectorised numpy,
too slow to call per simulated iteration).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sim.state import NodeConfig

if TYPE_CHECKING:
    from planner.profile import Profile

PROFILE_DIR = Path(__file__).resolve().parent / "gpu_profiles"
DEFAULT_PROFILE = PROFILE_DIR / "gb300x4-glm45-fp8.json"


@dataclass(frozen=True, slots=True)
class LinearIterationModel:
    """prefill ms = a + b·u + c·cached + d·pair/1e4, pair = Σ over the batch's
    requests of u_i·(u_i + cached_i) (one request: u·(u+cached));
    decode ms = a + b·batch + c·context."""

    prefill: tuple[float, float, float, float]
    decode: tuple[float, float, float]

    def predict_prefill_ms(
        self, uncached_tokens: float, cached_tokens: float, pair_tokens: float | None = None
    ) -> float:
        a, b, c, d = self.prefill
        u = uncached_tokens
        pair = u * (u + cached_tokens) if pair_tokens is None else pair_tokens
        return a + b * u + c * cached_tokens + d * pair / 1e4

    def predict_decode_ms(self, batch_size: float, context_tokens: float) -> float:
        a, b, c = self.decode
        return a + b * batch_size + c * context_tokens


@dataclass(frozen=True)
class GpuProfile:
    name: str
    gpus_per_node: int
    model: LinearIterationModel
    node: NodeConfig
    relaunch_s: float
    source: dict[str, str]

    @classmethod
    def from_json(cls, path: str | Path = DEFAULT_PROFILE) -> GpuProfile:
        d = json.loads(Path(path).read_text())
        p, q = d["prefill_ms"], d["decode_ms"]
        model = LinearIterationModel(
            (p["a"], p["b_per_uncached"], p["c_per_cached"], p["d_per_pair_1e4"]),
            (q["a"], q["b_per_seq"], q["c_per_context_token"]),
        )
        node = NodeConfig(
            chunk_tokens=d["chunk_tokens"],
            max_batch=d["max_batch"],
            kv_capacity_tokens=d["kv_capacity_tokens"],
            kv_bytes_per_token=d["kv_bytes_per_token"],
            pool_gbps=d["pool_gbps"],
            d2h_gbps=d["d2h_gbps"],
            switch_overhead_s=d["switch_overhead_s"],
        )
        return cls(d["name"], int(d["gpus_per_node"]), model, node, float(d["relaunch_s"]), dict(d["source"]))

    def planner_profile(self) -> Profile:  # imported lazily: optional dependency order
        from planner.profile import Profile

        return Profile.from_coefficients(self.model.prefill, self.model.decode)

    @classmethod
    def from_planner_profile(
        cls,
        profile: Profile,
        *,
        name: str,
        node: NodeConfig,
        step_overhead_ms: float = 0.0,
        gpus_per_node: int = 1,
        relaunch_s: float = 60.0,
        source: dict[str, str] | None = None,
    ) -> GpuProfile:
        """A simulator profile from a planner profile fitted on real records.

        The fitted coefficients (raw units: ms, ms/token, ms/(token²/1e4)) become
        the iteration model; `step_overhead_ms` is added to both intercepts: the
        engine's time between two iterations that vLLM's per-iteration
        `elapsed_ms` does not include (scheduling, output processing), so a
        simulated node is busy for what a real step costs end to end.
        """
        if step_overhead_ms < 0:
            raise ValueError("step_overhead_ms must be >= 0")
        p = tuple(float(x) for x in profile.prefill.theta)
        q = tuple(float(x) for x in profile.decode.theta)
        if len(p) != 4 or len(q) != 3:
            raise ValueError("expected 4 prefill and 3 decode coefficients")
        # A least-squares fit on a narrow range can give a slightly negative
        # slope; the simulator needs non-decreasing models (state.IterationModel).
        prefill = (max(0.0, p[0]) + step_overhead_ms, max(0.0, p[1]), max(0.0, p[2]), max(0.0, p[3]))
        decode = (max(0.0, q[0]) + step_overhead_ms, max(0.0, q[1]), max(0.0, q[2]))
        model = LinearIterationModel(prefill, decode)
        return cls(
            name,
            gpus_per_node,
            model,
            node,
            relaunch_s,
            dict(source or {"model": "planner.profile.Profile fitted from iteration records"}),
        )
