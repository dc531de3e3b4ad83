"""What gateway replicas share in Redis, on a real Redis: tenant limits (one
budget across replicas, the local share when Redis is down, replay after),
the workload stream with cluster-wide turn gaps, the overrides bus."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
import redis.exceptions

from gateway.control.bus import ClusterEvent, KeyRevoked, RedisBus
from gateway.control.workload_feed import LocalWorkloadFeed
from gateway.control.workload_stream import RedisWorkloadFeed
from gateway.http import errors
from gateway.kv.circuit import CircuitBreaker
from gateway.serving.policy.cluster_limits import ClusterLimits
from gateway.store.records import Policy
from planner.types import RequestSample
from testing.redis_server import own_redis
from testing.replica_cluster import clear_redis_prefix, redis_available

pytestmark = pytest.mark.redis
URL = "redis://127.0.0.1:6379/0"


@pytest.fixture
async def base() -> AsyncIterator[str]:
    if not redis_available(URL):
        pytest.skip("no Redis server on 127.0.0.1:6379")
    b = "{" + f"ei-test-{uuid.uuid4().hex[:10]}" + "}"
    yield b
    clear_redis_prefix(URL, b)


def client(url: str = URL) -> aioredis.Redis:
    return aioredis.Redis.from_url(url, decode_responses=True, socket_timeout=1.0, socket_connect_timeout=1.0)


async def admit_all(lims: list[ClusterLimits], policy: Policy, n: int, tokens: int = 1) -> list[int]:
    """n admissions round-robin over the replicas; 1 admitted, 0 refused (429)."""
    out = []
    for i in range(n):
        try:
            adm = await lims[i % len(lims)].acquire("t", policy, model="m", tokens=tokens)
            await lims[i % len(lims)].release(adm)
            out.append(1)
        except errors.RateLimited:
            out.append(0)
    return out


async def test_one_budget_across_three_replicas(base: str) -> None:
    lims = [ClusterLimits(client(), base, f"g{i}") for i in range(3)]
    got = await admit_all(lims, Policy(requests_per_minute=60), 200)
    assert sum(got) == 60 and got[:60] == [1] * 60
    with pytest.raises(errors.RateLimited) as exc:
        await lims[0].acquire("t", Policy(requests_per_minute=60), model="m", tokens=1)
    assert exc.value.code == "requests_per_minute_exceeded" and 55 < exc.value.retry_after_s <= 60
    # tokens: all or nothing, across replicas
    tok = Policy(tokens_per_minute=1000)
    a = await lims[0].acquire("tok", tok, model="m", tokens=600)
    with pytest.raises(errors.RateLimited) as too_many:
        await lims[1].acquire("tok", tok, model="m", tokens=500)
    assert too_many.value.code == "tokens_per_minute_exceeded"
    with pytest.raises(errors.InvalidRequest) as too_large:  # can never fit: a 400, as on one gateway
        await lims[2].acquire("tok", tok, model="m", tokens=1001)
    assert "too large" in too_large.value.message and too_large.value.code == "request_exceeds_tokens_per_minute"
    await lims[0].cancel(a)  # never ran: out of the window
    await lims[1].acquire("tok", tok, model="m", tokens=1000)


async def test_concurrency_is_cluster_wide_and_a_dead_replicas_slots_lapse(base: str) -> None:
    a = ClusterLimits(client(), base, "ga", lease_s=0.6)
    b = ClusterLimits(client(), base, "gb", lease_s=0.6)
    policy = Policy(max_concurrent=2)
    held = [await a.acquire("t", policy, model="m", tokens=1), await b.acquire("t", policy, model="m", tokens=1)]
    with pytest.raises(errors.RateLimited) as exc:
        await b.acquire("t", policy, model="m", tokens=1)
    assert exc.value.code == "concurrency_limit_exceeded"
    await a.release(held[0])
    await b.acquire("t", policy, model="m", tokens=1)  # a's slot came back
    # b renews its leases; "a" dies holding one more: it lapses, b's stay
    await a.acquire("t", Policy(max_concurrent=3), model="m", tokens=1)
    await asyncio.sleep(0.4)
    await b.renew_once()
    await asyncio.sleep(0.4)
    await b.renew_once()
    await b.acquire("t", Policy(max_concurrent=3), model="m", tokens=1)  # a's lease lapsed: 2 + 1
    with pytest.raises(errors.RateLimited):
        await b.acquire("t", Policy(max_concurrent=3), model="m", tokens=1)
    assert a.stats.admitted_local == b.stats.admitted_local == 0


async def test_redis_outage_local_share_then_replay() -> None:
    with own_redis() as server:
        base = "{outage}"
        lims = [
            ClusterLimits(
                client(server.url), base, f"g{i}", replicas=lambda: 2, breaker=CircuitBreaker(0.2, 0.2), recover_s=0.1
            )
            for i in range(2)
        ]
        for lim in lims:
            await lim.start()
        policy = Policy(requests_per_minute=40, max_concurrent=10)
        assert sum(await admit_all(lims[:1], policy, 10)) == 10  # in Redis, on replica 0
        server.stop()
        # each replica: its share, 20, counting what it admitted in this minute before the outage
        assert sum(await admit_all(lims[:1], policy, 40)) == 10
        assert sum(await admit_all(lims[1:], policy, 40)) == 20
        assert lims[0].stats.admitted_local == 10 and lims[1].stats.admitted_local == 20
        # concurrency share: 10 / 2
        held = [await lims[1].acquire("c", Policy(max_concurrent=10), model="m", tokens=1) for _ in range(5)]
        with pytest.raises(errors.RateLimited):
            await lims[1].acquire("c", Policy(max_concurrent=10), model="m", tokens=1)
        for h in held:
            await lims[1].release(h)
        server.start()  # empty: a restarted Redis without persistence
        await asyncio.sleep(0.6)  # both replicas' probes put their minute back: 10 + 10 + 20 = 40 of 40
        assert lims[0].stats.replayed == 20 and lims[1].stats.replayed == 20
        assert sum(await admit_all(lims, policy, 10)) == 0
        assert lims[0].stats.admitted_local == 10  # back in Redis: nothing more admitted locally
        for lim in lims:
            await lim.stop()


async def test_workload_stream_gives_every_replica_every_sample_with_cluster_gaps(base: str) -> None:
    feeds = [RedisWorkloadFeed(client(), base, f"g{i}") for i in range(3)]
    local = LocalWorkloadFeed()  # what one gateway would compute on the same turns
    for f in feeds:
        await f.start()
    try:
        turns = [  # (arrival, e2e, branch, last): one branch's turns land on different replicas
            (100.0, 1.0, "t/a", False),
            (100.5, 0.5, "t/b", False),
            (103.0, 1.0, "t/a", False),
            (104.0, 2.0, "t/b", True),
            (107.5, 1.0, "t/a", True),
            (108.0, 1.0, None, False),
        ]
        for i, (t, e2e, branch, last) in enumerate(turns):
            ttft = None if i == 5 else e2e / 4  # a sample without a TTFT stays without one
            s = RequestSample(
                t=t, uncached_prompt_tokens=64 + i, cached_prompt_tokens=32, output_tokens=8, e2e_s=e2e, ttft_s=ttft
            )
            feeds[i % 3].add(s, branch=branch, last_in_branch=last)
            local.add(s, branch=branch, last_in_branch=last)
            await asyncio.sleep(0.05)  # a turn's sample is sent before the branch's next one ends
        want = local.drain()
        for f in feeds:
            got = await _drain_until(f, len(want))
            # The stream keeps the order finishes reach Redis: one branch's turns in
            # order, different replicas' finishes as their writers ran (a busy host
            # can send 104.0 from g1 before 103.0 from g0). The planner reads a
            # window, not a sequence; what must match is every sample and its gap.
            assert sorted((s.t, s.uncached_prompt_tokens, s.gap_s, s.ttft_s) for s in got) == [
                (s.t, s.uncached_prompt_tokens, s.gap_s, s.ttft_s) for s in want
            ]
        assert [s.gap_s for s in want] == [None, None, 2.0, 3.0, 3.5, None]
    finally:
        for f in feeds:
            await f.stop()


async def test_arrivals_and_rejections_are_counted_cluster_wide_and_never_go_down(base: str) -> None:
    feeds = [RedisWorkloadFeed(client(), base, f"g{i}") for i in range(3)]
    for f in feeds:
        await f.start()
    try:
        for i in range(30):  # round-robin, as a load balancer spreads them
            feeds[i % 3].count_arrival()
        for i in range(7):
            feeds[i % 3].count_rejection()
        assert feeds[0].counts() == (10, 3)  # before anything is sent: this replica's own counts
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5.0
        seen: list[tuple[int, int]] = []
        while loop.time() < deadline and any(f.counts() != (30, 7) for f in feeds):
            seen += [f.counts() for f in feeds]
            await asyncio.sleep(0.02)
        assert [f.counts() for f in feeds] == [(30, 7)] * 3
        per_feed = [seen[i::3] for i in range(3)]
        assert all(a[0] <= b[0] and a[1] <= b[1] for run in per_feed for a, b in zip(run, run[1:], strict=False))
    finally:
        for f in feeds:
            await f.stop()


async def _drain_until(feed: RedisWorkloadFeed, n: int, timeout_s: float = 5.0) -> list[RequestSample]:
    got: list[RequestSample] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while len(got) < n and loop.time() < deadline:
        got += feed.drain()
        await asyncio.sleep(0.02)
    return got


async def test_bus_reaches_the_other_replicas_and_the_publisher_at_once(base: str) -> None:
    buses = [RedisBus(client(), base, f"g{i}") for i in range(3)]
    seen: dict[str, list[ClusterEvent]] = {f"g{i}": [] for i in range(3)}
    for bus in buses:

        async def handler(e: ClusterEvent, name: str = bus.replica) -> None:
            seen[name].append(e)

        bus.subscribe(handler)
        await bus.start()
    try:
        event = await buses[1].publish(KeyRevoked("key_9"))
        assert seen["g1"] == [event]  # the publisher's own handlers ran before publish returned
        for name in ("g0", "g2"):
            for _ in range(100):
                if seen[name]:
                    break
                await asyncio.sleep(0.01)
            assert seen[name] == [event]
        await asyncio.sleep(0.1)
        assert seen["g1"] == [event]  # its own message, coming back, is not applied twice
    finally:
        for bus in buses:
            await bus.stop()


async def test_a_redis_that_lost_the_script_gets_every_sample_once() -> None:
    """The writer sends the script by its SHA. A Redis restarted without
    persistence has no scripts: it refuses those rows (NOSCRIPT, nothing of
    them ran), the writer loads the script and sends them again; counts
    that went in the same round trip are not sent twice."""
    with own_redis() as server:
        feed = RedisWorkloadFeed(client(server.url), "{lost}", "g0")
        reader = RedisWorkloadFeed(client(server.url), "{lost}", "g1")
        await feed.start()
        await reader.start()
        try:
            sample = RequestSample(
                t=100.0, uncached_prompt_tokens=64, cached_prompt_tokens=0, output_tokens=8, e2e_s=1.0
            )
            feed.count_arrival()
            feed.add(sample, branch="t/a")
            assert len(await _drain_until(reader, 1)) == 1
            await client(server.url).script_flush()
            for _ in range(2):
                feed.count_arrival()
            feed.add(dataclasses.replace(sample, t=103.0), branch="t/a", last_in_branch=True)
            got = await _drain_until(reader, 2, timeout_s=2.0)
            assert [(s.t, s.gap_s) for s in got] == [(103.0, 2.0)]  # once, its gap from the branch's first turn
            assert feed.sent == 2 and feed.kept_local == 0
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 3.0
            while reader.counts() != (3, 0) and loop.time() < deadline:
                await asyncio.sleep(0.02)
            assert reader.counts() == (3, 0)
        finally:
            await feed.stop()
            await reader.stop()


async def test_rows_a_lost_script_could_not_resend_stay_on_this_replica_once() -> None:
    """Redis lost the script and the reload fails too: the counts went in the
    first round trip (counted once, not sent again), the refused row is this
    replica's own sample (its planner still sees it)."""
    with own_redis() as server:
        feed = RedisWorkloadFeed(client(server.url), "{lost2}", "g0")
        await client(server.url).script_flush()

        async def gone(*args: object, **kwargs: object) -> str:
            raise redis.exceptions.ConnectionError("gone between the two round trips")

        feed._r.script_load = gone  # type: ignore[method-assign]  # Redis dies right after its restart
        sample = RequestSample(t=100.0, uncached_prompt_tokens=64, cached_prompt_tokens=0, output_tokens=8, e2e_s=1.0)
        feed.count_arrival()
        feed.add(sample, branch="t/a")
        assert await feed.flush() == 1
        assert (feed.sent, feed.kept_local, feed.drain()) == (0, 1, [sample])
        assert await client(server.url).get("{lost2}:arrived") == "1" and feed.counts() == (1, 0)


async def test_counts_alone_reach_the_other_replicas_within_the_writers_tick(base: str) -> None:
    """An arrival costs no round trip of its own: counts travel with the next
    sample, or at the writer's tick (`COUNTS_EVERY_S`) when none finishes."""
    from gateway.control.workload_stream import COUNTS_EVERY_S

    feeds = [RedisWorkloadFeed(client(), base, f"g{i}") for i in range(2)]
    for f in feeds:
        await f.start()
    try:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        feeds[0].count_arrival()
        while feeds[1].counts() != (1, 0) and loop.time() < t0 + 5.0:
            await asyncio.sleep(0.01)
        assert feeds[1].counts() == (1, 0)
        # the tick, plus the reader's blocking XREAD (500 ms) before it reads the totals again
        assert loop.time() - t0 < COUNTS_EVERY_S + 0.5 + 0.5
    finally:
        for f in feeds:
            await f.stop()
