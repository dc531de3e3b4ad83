"""`TenantLimiter`: one tenant's limits (model allow-list, concurrency,
requests/min and tokens/min as sliding windows), pure over explicit time.

`acquire` either takes every limit at once and returns a ticket, or raises
without taking any; `release` ends one in-flight request; `cancel(ticket)`
undoes an admission whose request never ran. Not thread-safe: the gateway
calls it from its event loop only. `check` is the same decision without
taking anything (the Redis limiter's scripts implement the same rules).
"""

from __future__ import annotations

import itertools
import math

from gateway.http import errors
from gateway.serving.policy.windows import SlidingWindowLog
from gateway.store.records import Policy

CONCURRENCY_RETRY_AFTER_S = 1.0
WINDOW_S = 60.0


def _sync(log: SlidingWindowLog | None, limit: int | None) -> SlidingWindowLog | None:
    if limit is None:
        return None
    if log is None:
        return SlidingWindowLog(limit, WINDOW_S)
    log.resize(limit)
    return log


def refusal(policy: Policy, *, code: str, wait_s: float, tokens: int) -> errors.GatewayError:
    """The error for a refused admission (`code` names the limit), shared with
    the Redis limiter: a 429 with a Retry-After, or a 400 for a request that can
    never fit the tokens-per-minute budget (no Retry-After invites a retry)."""
    if code == "concurrency_limit_exceeded":
        return errors.RateLimited(
            f"Too many concurrent requests: limit {policy.max_concurrent}.",
            retry_after_s=CONCURRENCY_RETRY_AFTER_S,
            code=code,
        )
    if code == "request_too_large":
        return errors.InvalidRequest(
            f"Request too large: {tokens} tokens (prompt + max_tokens) exceeds the limit of "
            f"{policy.tokens_per_minute} tokens per minute, so it can never be served; "
            "lower max_tokens or shorten the prompt.",
            param="max_tokens",
            code="request_exceeds_tokens_per_minute",
        )
    if code == "requests_per_minute_exceeded":
        return errors.RateLimited(
            f"Rate limit reached: {policy.requests_per_minute} requests per minute.", retry_after_s=wait_s, code=code
        )
    return errors.RateLimited(
        f"Rate limit reached: {policy.tokens_per_minute} tokens per minute.",
        retry_after_s=wait_s,
        code="tokens_per_minute_exceeded",
    )


def check_model(policy: Policy, model: str) -> None:
    if not policy.allows_model(model):
        raise errors.PermissionDenied(
            f"This API key is not allowed to use the model `{model}`.", param="model", code="model_not_allowed"
        )


class TenantLimiter:
    def __init__(self, policy: Policy, *, now: float = 0.0) -> None:
        self.policy = policy
        self.in_flight = 0
        self._requests: SlidingWindowLog | None = None
        self._tokens: SlidingWindowLog | None = None
        self._ids = itertools.count(1)
        self.update_policy(policy, now=now)

    def update_policy(self, policy: Policy, *, now: float = 0.0) -> None:
        """Apply a changed policy; the windows' contents and the in-flight count carry over."""
        self.policy = policy
        self._requests = _sync(self._requests, policy.requests_per_minute)
        self._tokens = _sync(self._tokens, policy.tokens_per_minute)

    def acquire(self, *, model: str, tokens: int, now: float) -> int:
        """Admit one request costing `tokens` (prompt + max_tokens) or raise;
        returns the admission's ticket (for `cancel`).

        Raises `PermissionDenied` (model not allowed), `InvalidRequest` (a
        request larger than the whole tokens-per-minute budget: it can never
        fit, so no Retry-After invites a client to retry it), or `RateLimited`
        with a Retry-After (concurrency cap, request/token window).
        """
        policy = self.policy
        check_model(policy, model)
        if policy.max_concurrent is not None and self.in_flight >= policy.max_concurrent:
            raise refusal(policy, code="concurrency_limit_exceeded", wait_s=0.0, tokens=tokens)
        wait_requests = self._requests.wait_s(1, now) if self._requests else 0.0
        wait_tokens = self._tokens.wait_s(tokens, now) if self._tokens else 0.0
        if math.isinf(wait_tokens):
            raise refusal(policy, code="request_too_large", wait_s=wait_tokens, tokens=tokens)
        if wait_requests > 0:
            raise refusal(policy, code="requests_per_minute_exceeded", wait_s=wait_requests, tokens=tokens)
        if wait_tokens > 0:
            raise refusal(policy, code="tokens_per_minute_exceeded", wait_s=wait_tokens, tokens=tokens)
        ticket = next(self._ids)
        if self._requests:
            self._requests.add(1, now, ticket)
        if self._tokens:
            self._tokens.add(tokens, now, ticket)
        self.in_flight += 1
        return ticket

    def record(self, *, tokens: int, now: float) -> int:
        """Count an admission decided elsewhere (the Redis limiter) in the
        windows, without checking; returns its ticket. Not in flight here."""
        ticket = next(self._ids)
        if self._requests:
            self._requests.add(1, now, ticket)
        if self._tokens:
            self._tokens.add(tokens, now, ticket)
        return ticket

    def forget(self, ticket: int) -> None:
        """Take a `record`ed admission out of the windows."""
        if self._requests:
            self._requests.remove(ticket)
        if self._tokens:
            self._tokens.remove(ticket)

    def cancel(self, ticket: int) -> None:
        """Undo an `acquire` whose request never ran (takes it out of the windows)."""
        self.forget(ticket)
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
