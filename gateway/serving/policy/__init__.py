"""Tenant policy enforcement: pure token buckets and limiters, priority
admission, and `StoreTenantGate`, the `TenantGate` backed by the store.
"""

from gateway.serving.policy.admission import PriorityAdmission
from gateway.serving.policy.buckets import TokenBucket
from gateway.serving.policy.gate import GateConfig, StoreTenantGate
from gateway.serving.policy.limits import TenantLimiter
from gateway.store.records import Policy

__all__ = ["GateConfig", "Policy", "PriorityAdmission", "StoreTenantGate", "TenantLimiter", "TokenBucket"]
