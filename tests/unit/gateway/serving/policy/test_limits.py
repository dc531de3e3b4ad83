"""TenantLimiter: allow-list, concurrency, request and token windows, branches."""

from __future__ import annotations

import pytest

from gateway.http import errors
from gateway.serving.policy.limits import TenantLimiter
from gateway.store.records import Policy


def test_unlimited_policy_admits_everything() -> None:
    lim = TenantLimiter(Policy(), now=0.0)
    for _ in range(1000):
        lim.acquire(model="any", tokens=10**6, now=0.0)
    assert lim.in_flight == 1000


def test_model_allow_list() -> None:
    lim = TenantLimiter(Policy(allowed_models=("a",)), now=0.0)
    lim.acquire(model="a", tokens=1, now=0.0)
    with pytest.raises(errors.PermissionDenied) as exc:
        lim.acquire(model="b", tokens=1, now=0.0)
    assert exc.value.status == 403 and exc.value.code == "model_not_allowed" and exc.value.param == "model"
    assert lim.in_flight == 1


def test_concurrency_cap_and_release() -> None:
    lim = TenantLimiter(Policy(max_concurrent=2), now=0.0)
    lim.acquire(model="m", tokens=1, now=0.0)
    lim.acquire(model="m", tokens=1, now=0.0)
    with pytest.raises(errors.RateLimited) as exc:
        lim.acquire(model="m", tokens=1, now=0.0)
    assert exc.value.code == "concurrency_limit_exceeded" and exc.value.headers == {"Retry-After": "1"}
    lim.release()
    lim.acquire(model="m", tokens=1, now=0.0)


def test_requests_per_minute_is_a_sliding_window() -> None:
    lim = TenantLimiter(Policy(requests_per_minute=2), now=0.0)
    lim.acquire(model="m", tokens=1, now=0.0)
    lim.acquire(model="m", tokens=1, now=20.0)
    with pytest.raises(errors.RateLimited) as exc:
        lim.acquire(model="m", tokens=1, now=30.0)
    assert exc.value.retry_after_s == pytest.approx(30.0)  # the one at t=0 leaves the window at t=60
    assert exc.value.headers["Retry-After"] == "30"
    with pytest.raises(errors.RateLimited):
        lim.acquire(model="m", tokens=1, now=59.9)
    lim.acquire(model="m", tokens=1, now=60.0)
    with pytest.raises(errors.RateLimited) as again:
        lim.acquire(model="m", tokens=1, now=61.0)
    assert again.value.retry_after_s == pytest.approx(19.0)  # then the one at t=20, at t=80


def test_a_window_never_admits_more_than_the_limit() -> None:
    """A bucket that starts full and refills lets 2N through in the first minute; the window N."""
    lim = TenantLimiter(Policy(requests_per_minute=60), now=0.0)
    admitted = 0
    for i in range(200):  # 200 requests spread over 59.7 s
        try:
            lim.acquire(model="m", tokens=1, now=i * 0.3)
            admitted += 1
        except errors.RateLimited:
            pass
    assert admitted == 60


def test_tokens_per_minute_all_or_nothing() -> None:
    lim = TenantLimiter(Policy(requests_per_minute=10, tokens_per_minute=600), now=0.0)
    lim.acquire(model="m", tokens=300, now=0.0)
    lim.acquire(model="m", tokens=200, now=10.0)
    with pytest.raises(errors.RateLimited) as exc:
        lim.acquire(model="m", tokens=200, now=20.0)
    assert exc.value.code == "tokens_per_minute_exceeded"
    assert exc.value.retry_after_s == pytest.approx(40.0)  # the 300 at t=0 leave at t=60
    assert lim.in_flight == 2
    lim.acquire(model="m", tokens=100, now=20.0)  # the refused attempt took nothing
    with pytest.raises(errors.InvalidRequest) as big:
        lim.acquire(model="m", tokens=601, now=20.0)
    # It can never fit: a 400 with no Retry-After, so SDKs do not retry it.
    assert big.value.status == 400 and big.value.headers == {} and "too large" in big.value.message
    assert big.value.code == "request_exceeds_tokens_per_minute" and big.value.param == "max_tokens"
    assert lim.in_flight == 3  # nothing taken


def test_cancel_takes_the_admission_out_of_the_windows() -> None:
    lim = TenantLimiter(Policy(requests_per_minute=1, tokens_per_minute=100), now=0.0)
    ticket = lim.acquire(model="m", tokens=100, now=0.0)
    lim.cancel(ticket)
    assert lim.in_flight == 0
    lim.acquire(model="m", tokens=100, now=0.0)
    with pytest.raises(errors.RateLimited):
        lim.acquire(model="m", tokens=1, now=1.0)


def test_policy_update_keeps_in_flight() -> None:
    lim = TenantLimiter(Policy(max_concurrent=1), now=0.0)
    lim.acquire(model="m", tokens=1, now=0.0)
    lim.update_policy(Policy(max_concurrent=2, requests_per_minute=1), now=0.0)
    lim.acquire(model="m", tokens=1, now=0.0)
    with pytest.raises(errors.RateLimited):
        lim.acquire(model="m", tokens=1, now=0.0)


def test_branch_limit() -> None:
    lim = TenantLimiter(Policy(max_active_branches=2), now=0.0)
    lim.check_branches(1, retry_after_s=5.0)
    with pytest.raises(errors.RateLimited) as exc:
        lim.check_branches(2, retry_after_s=5.0)
    assert exc.value.code == "branch_limit_exceeded" and exc.value.headers == {"Retry-After": "5"}
    TenantLimiter(Policy(), now=0.0).check_branches(10**6, retry_after_s=5.0)
