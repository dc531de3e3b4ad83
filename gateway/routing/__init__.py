"""Cache-aware P/D routing: pure scorers combined by a picker.

Public API: `route(request, nodes, config)` -> `RouteDecision`.
"""

from gateway.routing.picker import RouteDecision, RouterConfig, route
from gateway.routing.scorers import NodeLoad, RouteRequest

__all__ = ["NodeLoad", "RouteDecision", "RouteRequest", "RouterConfig", "route"]
