"""Waiting for a condition in async tests, with a deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def wait_for(cond: Callable[[], T | Awaitable[T]], timeout_s: float = 15.0, poll_s: float = 0.05) -> T:
    """Poll `cond` (sync or async) until it returns a truthy value; return it.
    Fails the test (AssertionError) after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value: Any = cond()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value  # the caller's T
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s"
        await asyncio.sleep(poll_s)
