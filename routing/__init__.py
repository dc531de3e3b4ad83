"""Cache-aware P/D routing: pure scorers combined by a picker.

Public API: `route(request, nodes, config)` -> `RouteDecision`.
"""

from routing.picker import RouteDecision, RouterConfig, route
from routing.scorers import NodeLoad, RouteRequest

__all__ = ["NodeLoad", "RouteDecision", "RouteRequest", "RouterConfig", "route"]
