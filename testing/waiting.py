"""Waiting for a condition in async tests, with a deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")


@overload
async def wait_for(cond: Callable[[], Awaitable[T | None]], timeout_s: float = ..., poll_s: float = ...) -> T: ...
@overload
async def wait_for(cond: Callable[[], T | None], timeout_s: float = ..., poll_s: float = ...) -> T: ...
async def wait_for(cond: Callable[[], Any], timeout_s: float = 15.0, poll_s: float = 0.05) -> Any:
    """Poll `cond` (sync or async) until it returns a truthy value; return it
    (never None). Fails the test (AssertionError) after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s"
        await asyncio.sleep(poll_s)
