"""Tenant policy enforcement: pure token buckets and limiters, priority
admission, and `StoreTenantGate`, the `TenantGate` backed by the store.
"""

from gateway.policy.admission import PriorityAdmission
from gateway.policy.buckets import TokenBucket
from gateway.policy.gate import GateConfig, StoreTenantGate
from gateway.policy.limits import TenantLimiter
from gateway.store.records import Policy

__all__ = ["GateConfig", "Policy", "PriorityAdmission", "StoreTenantGate", "TenantLimiter", "TokenBucket"]
