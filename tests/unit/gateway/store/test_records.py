"""Policy validation, secret hashing and JSON sanitising (no database)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from core import Phase
from gateway.admin.schemas import PolicyBody
from gateway.store import credentials
from gateway.store._event_repo import json_safe, minute_of
from gateway.store.records import Policy
from planner.types import SwitchAction


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"requests_per_minute": 0}, "requests_per_minute must be a positive integer"),
        ({"tokens_per_minute": -1}, "tokens_per_minute must be a positive integer"),
        ({"max_concurrent": 0}, "max_concurrent must be a positive integer"),
        ({"priority": 4}, "priority must be an integer in 0..3"),
        ({"priority": -1}, "priority must be an integer in 0..3"),
        ({"allowed_models": ("a", "a")}, "allowed_models must not repeat a model"),
        ({"allowed_models": ("",)}, "allowed_models must be non-empty strings"),
        ({"max_active_branches": 0}, "max_active_branches must be a positive integer"),
        ({"kv_retention_blocks": -1}, "kv_retention_blocks must be a non-negative integer"),
    ],
)
def test_policy_rejects_invalid_values(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Policy(**kwargs)


def test_policy_defaults_are_open_and_isolated() -> None:
    p = Policy()
    assert p.allows_model("anything") and p.cache_isolation and p.priority == 1
    assert not Policy(allowed_models=()).allows_model("m")


def test_policy_body_roundtrip() -> None:
    policy = Policy(requests_per_minute=5, allowed_models=("a", "b"), cache_isolation=False)
    body = PolicyBody.of(policy)
    assert body.allowed_models == ["a", "b"]
    assert body.to_policy() == policy


def test_secret_hash_needs_salt_and_pepper() -> None:
    new = credentials.new_secret(credentials.TENANT_KEY_PREFIX, pepper="p")
    assert new.secret.startswith("sk-ei-") and len(new.secret) > 40 and new.prefix == new.secret[:12]
    assert credentials.verify_secret(new.secret, salt=new.salt, pepper="p", secret_hash=new.secret_hash)
    assert not credentials.verify_secret(new.secret, salt=new.salt, pepper="q", secret_hash=new.secret_hash)
    assert not credentials.verify_secret(new.secret, salt="x", pepper="p", secret_hash=new.secret_hash)
    again = credentials.seal_secret(new.secret, pepper="p")
    assert again.salt != new.salt and again.secret_hash != new.secret_hash


def test_json_safe() -> None:
    assert json_safe({"a": math.nan, "b": (1, math.inf), 3: SwitchAction("n", Phase.DECODE)}) == {
        "a": None,
        "b": [1, None],
        "3": {"node_id": "n", "to_phase": "decode"},
    }


def test_minute_of() -> None:
    assert minute_of(119.9) == 60 and minute_of(120.0) == 120
