"""`TenantLimiter`: one tenant's limits (model allow-list, concurrency,
requests/min and tokens/min buckets), pure over explicit time.

`acquire` either takes every limit at once or raises without taking any;
`release` ends one in-flight request. Not thread-safe: the gateway calls it
from its event loop only.
"""

from __future__ import annotations

import math

from gateway import errors
from gateway.serving.policy.buckets import TokenBucket
from gateway.store.records import Policy

CONCURRENCY_RETRY_AFTER_S = 1.0


def _sync_bucket(bucket: TokenBucket | None, limit: int | None, now: float) -> TokenBucket | None:
    if limit is None:
        return None
    if bucket is None:
        return TokenBucket.per_minute(limit, now=now)
    bucket.reconfigure(capacity=limit, rate_per_s=limit / 60.0, now=now)
    return bucket


class TenantLimiter:
    def __init__(self, policy: Policy, *, now: float) -> None:
        self.policy = policy
        self.in_flight = 0
        self._requests: TokenBucket | None = None
        self._tokens: TokenBucket | None = None
        self.update_policy(policy, now=now)

    def update_policy(self, policy: Policy, *, now: float) -> None:
        """Apply a changed policy; bucket fill and in-flight count carry over."""
        self.policy = policy
        self._requests = _sync_bucket(self._requests, policy.requests_per_minute, now)
        self._tokens = _sync_bucket(self._tokens, policy.tokens_per_minute, now)

    def acquire(self, *, model: str, tokens: int, now: float) -> None:
        """Admit one request costing `tokens` (prompt + max_tokens) or raise.

        Raises `PermissionDenied` (model not allowed), `InvalidRequest` (a
        request larger than the whole tokens-per-minute budget: it can never
        fit, so no Retry-After invites a client to retry it), or `RateLimited`
        with a Retry-After (concurrency cap, request/token bucket).
        """
        policy = self.policy
        if not policy.allows_model(model):
            raise errors.PermissionDenied(
                f"This API key is not allowed to use the model `{model}`.", param="model", code="model_not_allowed"
            )
        if policy.max_concurrent is not None and self.in_flight >= policy.max_concurrent:
            raise errors.RateLimited(
                f"Too many concurrent requests: limit {policy.max_concurrent}.",
                retry_after_s=CONCURRENCY_RETRY_AFTER_S,
                code="concurrency_limit_exceeded",
            )
        wait_requests = self._requests.wait_s(1, now) if self._requests else 0.0
        wait_tokens = self._tokens.wait_s(tokens, now) if self._tokens else 0.0
        if math.isinf(wait_tokens):
            raise errors.InvalidRequest(
                f"Request too large: {tokens} tokens (prompt + max_tokens) exceeds the limit of "
                f"{policy.tokens_per_minute} tokens per minute, so it can never be served; "
                "lower max_tokens or shorten the prompt.",
                param="max_tokens",
                code="request_exceeds_tokens_per_minute",
            )
        if wait_requests > 0:
            raise errors.RateLimited(
                f"Rate limit reached: {policy.requests_per_minute} requests per minute.",
                retry_after_s=wait_requests,
                code="requests_per_minute_exceeded",
            )
        if wait_tokens > 0:
            raise errors.RateLimited(
                f"Rate limit reached: {policy.tokens_per_minute} tokens per minute.",
                retry_after_s=wait_tokens,
                code="tokens_per_minute_exceeded",
            )
        if self._requests:
            self._requests.take(1, now)
        if self._tokens:
            self._tokens.take(tokens, now)
        self.in_flight += 1

    def cancel(self, *, tokens: int, now: float) -> None:
        """Undo an `acquire` whose request never ran (refunds the buckets)."""
        if self._requests:
            self._requests.give_back(1, now)
        if self._tokens:
            self._tokens.give_back(tokens, now)
        self.release()

    def release(self) -> None:
        assert self.in_flight > 0, "release without acquire"
        self.in_flight -= 1

    def check_branches(self, active_branches: int, *, retry_after_s: float) -> None:
        """Raise `RateLimited` if opening another branch would exceed the cap.

        `active_branches` is the tenant's count of active branches *before* the
        new one (the gateway reads it from the directory).
        """
        limit = self.policy.max_active_branches
        if limit is not None and active_branches >= limit:
            raise errors.RateLimited(
                f"Too many active branches: limit {limit}. Finish a branch "
                "(X-Branch-Finished: true) or wait for idle branches to expire.",
                retry_after_s=retry_after_s,
                code="branch_limit_exceeded",
            )
