"""Policy validation, secret hashing and JSON sanitising (no database)."""

from __future__ import annotations

import math

import pytest

from core import Phase
from gateway.admin.schemas import PolicyBody
from gateway.store import credentials
from gateway.store._event_repo import json_safe, minute_of
from gateway.store.records import Policy
from planner.types import SwitchAction


@pytest.mark.parametrize(
    "kwargs",
    [
        {"requests_per_minute": 0},
        {"tokens_per_minute": -1},
        {"max_concurrent": 0},
        {"priority": 4},
        {"priority": -1},
        {"allowed_models": ("a", "a")},
        {"allowed_models": ("",)},
        {"max_active_branches": 0},
        {"kv_retention_blocks": -1},
    ],
)
def test_policy_rejects_invalid_values(kwargs: dict) -> None:
    with pytest.raises(ValueError):
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
