"""Repository: keyword-only functions over a `Session`; they never commit.

    with db.session() as session:
        tenant = repository.create_tenant(session, name="acme")
        key, secret = repository.create_api_key(session, tenant_id=tenant.id, pepper=db.pepper)
"""

from gateway.store._event_repo import (
    NODE_PIN_PREFIX, PLANNER_MODE, SPLIT_PIN, add_audit, add_decision, add_switch_event, add_usage,
    get_overrides, json_safe, list_audit, list_decisions, list_switch_events, list_usage, minute_of,
    set_override,
)
from gateway.store._tenant_repo import (
    count_active_admin_tokens, create_admin_token, create_api_key, create_tenant, delete_tenant,
    find_admin_token, get_policy, get_tenant, list_admin_tokens, list_api_keys, list_tenants,
    load_key_grants, put_policy, rename_tenant, revoke_admin_token, revoke_api_key,
)

__all__ = [
    "NODE_PIN_PREFIX", "PLANNER_MODE", "SPLIT_PIN", "add_audit", "add_decision", "add_switch_event",
    "add_usage", "get_overrides", "json_safe", "list_audit", "list_decisions", "list_switch_events",
    "list_usage", "minute_of", "set_override", "count_active_admin_tokens", "create_admin_token",
    "create_api_key", "create_tenant", "delete_tenant", "find_admin_token", "get_policy", "get_tenant",
    "list_admin_tokens", "list_api_keys", "list_tenants", "load_key_grants", "put_policy", "rename_tenant",
    "revoke_admin_token", "revoke_api_key",
]
