"""The Redis loops end on stop() even when a cancel comes out of redis-py
as a TimeoutError (which they retry on): seen as a hung test run."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from gateway.control.bus import RedisBus
from gateway.control.workload_stream import RedisWorkloadFeed
from testing.swallowing_redis import SwallowingRedis


async def test_the_workload_feed_stops_though_its_cancel_is_swallowed() -> None:
    r = SwallowingRedis()
    feed = RedisWorkloadFeed(cast(Any, r), "{t}", "g0", retry_s=0.01)
    await feed.start()
    while r.blocked_reads == 0:
        await asyncio.sleep(0.01)
    await asyncio.wait_for(feed.stop(), 2.0)


async def test_the_bus_stops_though_its_cancel_is_swallowed() -> None:
    bus = RedisBus(cast(Any, SwallowingRedis()), "{t}", "g0", retry_s=0.01)
    await bus.start()
    assert bus.subscribed.is_set()
    await asyncio.wait_for(bus.stop(), 2.0)
