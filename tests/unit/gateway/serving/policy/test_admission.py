"""PriorityAdmission: global slots handed out by priority class, bounded wait."""

from __future__ import annotations

import asyncio

import pytest

from gateway.http import errors
from gateway.serving.policy.admission import PriorityAdmission


async def test_unlimited_never_waits() -> None:
    # max_wait_s=0: any acquire that queued would raise RateLimited at once.
    adm = PriorityAdmission(limit=None, max_wait_s=0.0)
    async with asyncio.timeout(1.0):
        for _ in range(100):
            await adm.acquire(3)
    assert (adm.in_use, adm.waiting) == (100, 0)
    for _ in range(100):
        adm.release()
    assert adm.in_use == 0


async def test_freed_slot_goes_to_best_priority_then_fifo() -> None:
    adm = PriorityAdmission(limit=1, max_wait_s=5.0)
    await adm.acquire(1)
    order: list[str] = []

    async def wait(name: str, priority: int) -> None:
        await adm.acquire(priority)
        order.append(name)

    tasks = [asyncio.create_task(wait(n, p)) for n, p in [("low", 3), ("mid-a", 1), ("high", 0), ("mid-b", 1)]]
    await asyncio.sleep(0)
    assert adm.waiting == 4
    for _ in range(4):
        adm.release()
        await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    assert order == ["high", "mid-a", "mid-b", "low"]
    assert adm.in_use == 1
    adm.release()
    assert adm.in_use == 0


async def test_wait_is_bounded_with_429() -> None:
    adm = PriorityAdmission(limit=1, max_wait_s=0.05)
    await adm.acquire(0)
    with pytest.raises(errors.RateLimited) as exc:
        await adm.acquire(0)
    assert exc.value.status == 429 and exc.value.code == "cluster_saturated"
    assert adm.waiting == 0
    adm.release()
    assert adm.in_use == 0


async def test_cancelled_waiter_does_not_leak_a_slot() -> None:
    adm = PriorityAdmission(limit=1, max_wait_s=5.0)
    await adm.acquire(0)
    task = asyncio.create_task(adm.acquire(0))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    adm.release()
    assert adm.in_use == 0
