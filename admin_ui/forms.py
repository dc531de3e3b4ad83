"""Validation of the tenant policy form before it is sent (pure).

The admin API validates again (`gateway.store.records.Policy`); checking here
lets the form point at the bad field without a round trip. The rules mirror
the store's: limits are positive integers or empty (= unlimited),
`kv_retention_blocks` may be 0, priority is 0 (highest) .. 3.
"""

from __future__ import annotations

from typing import Any

MAX_PRIORITY = 3
POSITIVE_LIMITS = ("requests_per_minute", "tokens_per_minute", "max_concurrent", "max_active_branches")
LIMIT_LABELS = {
    "requests_per_minute": "Requests per minute",
    "tokens_per_minute": "Tokens per minute",
    "max_concurrent": "Max concurrent requests",
    "max_active_branches": "Max active branches",
    "kv_retention_blocks": "KV retention (blocks)",
}


def parse_models(text: str) -> list[str] | None:
    """'a, b' → ['a', 'b']; blank → None (all models allowed)."""
    models = [m.strip() for m in text.replace("\n", ",").split(",")]
    models = [m for m in models if m]
    return models or None


def validate_policy(raw: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """(policy body for PUT, {field: problem}); send only when there is no problem."""
    errors: dict[str, str] = {}
    policy: dict[str, Any] = {}
    for name in (*POSITIVE_LIMITS, "kv_retention_blocks"):
        value = raw.get(name)
        if value is None or value == "":
            policy[name] = None
            continue
        floor = 0 if name == "kv_retention_blocks" else 1
        if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
            errors[name] = "must be a whole number"
        elif value < floor:
            errors[name] = f"must be at least {floor}, or empty for unlimited"
        else:
            policy[name] = int(value)
    priority = raw.get("priority")
    if (
        isinstance(priority, bool)
        or not isinstance(priority, (int, float))
        or int(priority) != priority
        or not 0 <= priority <= MAX_PRIORITY
    ):
        errors["priority"] = f"must be a whole number from 0 (highest) to {MAX_PRIORITY}"
    else:
        policy["priority"] = int(priority)
    models = raw.get("allowed_models")
    if isinstance(models, str):
        models = parse_models(models)
    if models is not None and len(set(models)) != len(models):
        errors["allowed_models"] = "lists a model twice"
    policy["allowed_models"] = models
    policy["cache_isolation"] = bool(raw.get("cache_isolation", True))
    return policy, errors
