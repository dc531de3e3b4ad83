"""One simulation run and a pool of them (shared by `simulate`, `--oracle` and `--suite`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from sim.cluster import Cluster, SimConfig
from sim.profiles import GpuProfile
from sim.scenarios import Scenario

if TYPE_CHECKING:
    from planner.estimator_config import EstimatorConfig
    from planner.types import Planner

T = TypeVar("T")


def sim_estimator_config() -> EstimatorConfig:
    """The planner's estimator told how this engine holds KV: the simulated
    decode engine reserves a request's whole output at admission."""
    from planner.estimator_config import EstimatorConfig

    return EstimatorConfig(kv_output_reserved=1.0)


def make_sim_planner(name: str, gpu: GpuProfile, prefill_nodes: int) -> Planner | None:
    """A planner by name: evolving (with the profile's prior), dynamo, static,
    none, or "schedule:0=2,3600=5" (a time table; picklable for the pool)."""
    from planner.registry import make_planner

    if name == "evolving":
        return make_planner("evolving", profile=gpu.planner_profile(), estimator=sim_estimator_config())
    if name == "dynamo":
        return make_planner("dynamo")
    if name == "static":
        return make_planner("static", prefill_nodes=prefill_nodes)
    if name == "none":
        return None
    if name.startswith("schedule:"):
        pairs = [item.split("=") for item in name.split(":", 1)[1].split(",")]
        return make_planner("schedule", schedule=[(float(t), int(p)) for t, p in pairs])
    raise ValueError(name)


def run_one(args: tuple[Scenario, str, str, int, int, dict[str, Any]]) -> dict[str, Any]:
    """One simulation: (scenario, planner, profile path, prefill_nodes, seed, extra SimConfig fields)."""
    sc, planner, profile_path, p, seed, extra = args
    gpu = GpuProfile.from_json(profile_path)
    t0 = time.perf_counter()
    cfg = SimConfig(nodes=sc.nodes, prefill_nodes=p, seed=seed, **extra)
    log = Cluster(sc.workload, gpu, make_sim_planner(planner, gpu, p), cfg).run()
    out = log.summary()
    out["initial_split"] = [p, sc.nodes - p]
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    out["events"] = log.events_processed
    return out


def run_all(fn: Callable[[T], dict[str, Any]], tasks: Sequence[T], jobs: int) -> list[dict[str, Any]]:
    """`fn` over `tasks` in order, on `jobs` processes when there is more than one task."""
    if jobs > 1 and len(tasks) > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            return list(pool.map(fn, tasks, chunksize=1))
    return [fn(t) for t in tasks]
