"""Discrete-event cluster simulator driving the real router, directory and planners.

Public API: `Cluster(workload, GpuProfile, planner, SimConfig).run() -> RunLog`
(`.summary()` for metrics); `GpuProfile.from_json(path)`.
"""

from sim.cluster import Cluster, SimConfig
from sim.profiles import GpuProfile

__all__ = ["Cluster", "GpuProfile", "SimConfig"]
