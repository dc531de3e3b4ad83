"""The outage share of a tenant's limits: literal policies."""

from __future__ import annotations

import pytest

from gateway.serving.policy.cluster_limits import share_of
from gateway.store.records import Policy


@pytest.mark.parametrize(
    ("replicas", "rpm", "tpm", "conc", "branches"),
    [
        (1, 60, 6000, 8, 10),
        (3, 20, 2000, 3, 4),  # 8/3 and 10/3 round up: never below the limit in total
        (4, 15, 1500, 2, 3),
        (100, 1, 60, 1, 1),  # never 0: a share of "refuse everything" is no share
        (0, 60, 6000, 8, 10),  # an unknown count counts as one
    ],
)
def test_share_is_the_limit_over_replicas_rounded_up(
    replicas: int, rpm: int, tpm: int, conc: int, branches: int
) -> None:
    p = Policy(requests_per_minute=60, tokens_per_minute=6000, max_concurrent=8, max_active_branches=10, priority=0)
    share = share_of(p, replicas)
    assert (share.requests_per_minute, share.tokens_per_minute, share.max_concurrent, share.max_active_branches) == (
        rpm,
        tpm,
        conc,
        branches,
    )
    assert share.priority == 0 and share.cache_isolation is True


def test_unlimited_stays_unlimited() -> None:
    assert share_of(Policy(), 3) == Policy()
