"""`Orchestrator.stream(job, lane=...)`: a decode stream's plain token chunks go
to a ready lane while the stream waits, everything else is yielded, and the
two together are the job's tokens in order (in-process fake workers, which
offer every chunk as the raw client does)."""

from __future__ import annotations

import asyncio

from core import Phase
from gateway.serving.jobs import Finished, Job, TokenDelta
from tests.unit.gateway.serving.test_orchestrator import PROMPT, Cluster, expected, job


class Lane:
    """A `DeltaLane` recording what it takes in `log`; `ready` follows `readiness` (cycled)."""

    def __init__(self, log: list[tuple[str, list[int]]], readiness: tuple[bool, ...] = (True,)) -> None:
        self.log, self._readiness, self._asked = log, readiness, 0

    def ready(self) -> bool:
        self._asked += 1
        return self._readiness[(self._asked - 1) % len(self._readiness)]

    def __call__(self, delta: TokenDelta) -> None:
        self.log.append(("lane", list(delta.token_ids)))


async def run(c: Cluster, j: Job, lane: Lane, on_token=None) -> Finished:
    async for ev in c.orch.stream(j, lane=lane):
        if isinstance(ev, TokenDelta):
            lane.log.append(("yield", list(ev.token_ids)))
            if on_token is not None:
                await on_token(sum(len(t) for _, t in lane.log))
        else:
            return ev
    raise AssertionError("no Finished event")


def tokens(log: list[tuple[str, list[int]]], source: str | None = None) -> list[int]:
    return [t for s, ts in log for t in ts if source is None or s == source]


async def test_a_ready_lane_takes_the_decode_tokens_and_the_end_is_yielded() -> None:
    c = await Cluster([Phase.DECODE], delay=0.001).start()
    log: list[tuple[str, list[int]]] = []
    done = await run(c, job(PROMPT, 12), Lane(log))
    assert tokens(log) == expected(PROMPT, 12) and done.completion_tokens == 12
    assert [s for s, _ in log] == ["lane"] * 11 + ["yield"]  # the last chunk carries the finish


async def test_a_lane_that_is_not_ready_changes_nothing_and_order_holds() -> None:
    c = await Cluster([Phase.DECODE], delay=0.001).start()
    log: list[tuple[str, list[int]]] = []
    done = await run(c, job(PROMPT, 20), Lane(log, readiness=(True, False, False)))
    assert tokens(log) == expected(PROMPT, 20) and done.completion_tokens == 20
    assert tokens(log, "lane") and len(tokens(log, "yield")) > 1


async def test_the_prefill_token_is_yielded_and_the_decode_tokens_take_the_lane() -> None:
    c = await Cluster([Phase.PREFILL, Phase.DECODE]).start()
    log: list[tuple[str, list[int]]] = []
    done = await run(c, job(PROMPT, 8), Lane(log))
    assert tokens(log) == expected(PROMPT, 8) and done.nodes == ["w0", "w1"]
    assert log[0] == ("yield", expected(PROMPT, 1)) and [s for s, _ in log[1:-1]] == ["lane"] * 6


async def test_a_migration_through_the_lane_loses_and_repeats_nothing() -> None:
    c = await Cluster([Phase.DECODE, Phase.DECODE], delay=0.002).start()
    log: list[tuple[str, list[int]]] = []
    lane = Lane(log, readiness=(True, True, False))
    started: list[asyncio.Task[object]] = []

    async def switch_at(n: int) -> None:  # a yielded token after the fifth: switch the busy node away
        if n >= 5 and not started:
            node = "w0" if c.w("w0").requests else "w1"
            started.append(asyncio.create_task(c.switcher.switch(node, Phase.PREFILL, reason="test", who="test")))

    done = await run(c, job(PROMPT, 40), lane, switch_at)
    assert tokens(log) == expected(PROMPT, 40)
    assert done.completion_tokens == 40 and done.resumes == 1
    await asyncio.gather(*started)
