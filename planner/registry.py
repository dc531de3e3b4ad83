"""Planner strategies by name, for the gateway's settings and the simulator.

``make_planner("evolving", profile=p, cooldown_s=30)``: keyword arguments
are the strategy's config fields (``config=`` passes a whole config object,
further keywords override its fields); ``static`` takes ``prefill_nodes``,
``schedule`` a ``schedule`` of ``(from_t, prefill_nodes)`` pairs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from planner.baselines import DynamoConfig, DynamoPlanner, ScheduledPlanner, StaticPlanner
from planner.evolving import EvolvingConfig, EvolvingPlanner
from planner.profile import Profile
from planner.types import Planner


def _evolving(config: EvolvingConfig | None = None, profile: Profile | None = None, **fields: Any) -> EvolvingPlanner:
    return EvolvingPlanner(dataclasses.replace(config or EvolvingConfig(), **fields), profile)


def _static(prefill_nodes: int) -> StaticPlanner:
    return StaticPlanner(prefill_nodes)


def _schedule(schedule: list[tuple[float, int]]) -> ScheduledPlanner:
    return ScheduledPlanner(schedule)


def _dynamo(config: DynamoConfig | None = None, **fields: Any) -> DynamoPlanner:
    return DynamoPlanner(dataclasses.replace(config or DynamoConfig(), **fields))


PLANNERS: dict[str, Callable[..., Planner]] = {
    "evolving": _evolving,
    "static": _static,
    "dynamo": _dynamo,
    "schedule": _schedule,
}


def make_planner(name: str, **kwargs: Any) -> Planner:
    """Build the planner registered as ``name``; ValueError if unknown."""
    try:
        factory = PLANNERS[name]
    except KeyError:
        raise ValueError(f"unknown planner {name!r}; known: {', '.join(sorted(PLANNERS))}") from None
    return factory(**kwargs)
