"""Tenant policy enforcement: pure sliding-window limiters, priority
admission, the cluster-wide Redis limiter, and `StoreTenantGate`, the
`TenantGate` backed by the store.
"""

from gateway.serving.policy.admission import PriorityAdmission
from gateway.serving.policy.gate import GateConfig, StoreTenantGate
from gateway.serving.policy.limits import TenantLimiter
from gateway.serving.policy.windows import SlidingWindowLog
from gateway.store.records import Policy

__all__ = ["GateConfig", "Policy", "PriorityAdmission", "StoreTenantGate", "SlidingWindowLog", "TenantLimiter"]
