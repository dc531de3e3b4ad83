"""Cache-aware P/D routing: pure scorers combined by a picker.

Public API: `route(request, nodes, config)` -> `RouteDecision`; `pick_decode`
(the decode half alone, for a decode node picked after the prefill).
"""

from routing.picker import RouteDecision, RouterConfig, pick_decode, route
from routing.scorers import NodeLoad, RouteRequest

__all__ = ["NodeLoad", "RouteDecision", "RouteRequest", "RouterConfig", "pick_decode", "route"]
