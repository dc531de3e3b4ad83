"""Orchestrator end to end over in-process fake workers (testing.fake_worker)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses

import pytest

from core import Phase, Role
from gateway.control.phase_switch import PhaseSwitcher
from gateway.control.registry import WorkerRegistry
from gateway.http.errors import GatewayError, UpstreamFailed
from gateway.kv.directory import GatewayDirectory
from gateway.serving.jobs import Finished, Job, TokenDelta
from gateway.serving.orchestrator import Orchestrator, OrchestratorConfig
from kvpool.directory import MemoryDirectory
from routing import RouterConfig
from testing.fake_worker import FakeWorker, InProcessWorkerClient, next_token
from workers.protocol import SamplingOptions

LO, HI = 300, 1300


def expected(prompt: list[int], n: int) -> list[int]:
    ctx = list(prompt)
    for _ in range(n):
        ctx.append(next_token(ctx, LO, HI))
    return ctx[len(prompt) :]


class Cluster:
    def __init__(
        self, phases: list[Phase], *, delay: float = 0.0, local_max: int = 8, resume_wait_s: float = 60.0
    ) -> None:
        self.workers = {
            f"http://w{i}": FakeWorker(f"w{i}", phase=p, token_delay_s=delay, block_size=4)
            for i, p in enumerate(phases)
        }
        self.client = InProcessWorkerClient(self.workers)
        self.directory = GatewayDirectory(MemoryDirectory(), block_size=4)
        self.registry = WorkerRegistry(self.client, self.directory, failures_to_unhealthy=1)
        self.orch = Orchestrator(
            self.registry,
            self.client,
            self.directory,
            OrchestratorConfig(router=RouterConfig(local_prefill_max_tokens=local_max), resume_wait_s=resume_wait_s),
        )
        self.switcher = PhaseSwitcher(self.registry, self.client)

    async def start(self) -> Cluster:
        for url in self.workers:
            await self.registry.add(url)
        return self

    def w(self, node: str) -> FakeWorker:
        return self.workers[f"http://{node}"]


def job(prompt: list[int], max_tokens: int, rid: str = "r1", branch: str | None = None) -> Job:
    return Job(
        request_id=rid,
        prompt_token_ids=prompt,
        sampling=SamplingOptions(max_tokens=max_tokens),
        tenant_salt="t",
        branch_id=branch,
    )


async def collect(orch: Orchestrator, j: Job, on_token=None) -> tuple[list[int], Finished]:
    """The job's tokens and `Finished`, the stream closed after it (as every caller does)."""
    tokens: list[int] = []
    async with contextlib.aclosing(orch.stream(j)) as events:
        async for ev in events:
            if isinstance(ev, TokenDelta):
                tokens.extend(ev.token_ids)
                if on_token is not None:
                    await on_token(len(tokens))
            else:
                return tokens, ev
    raise AssertionError("no Finished event")


PROMPT = list(range(10, 50))  # 40 tokens: 10 blocks of 4


async def test_local_decode_when_no_prefill_node():
    c = await Cluster([Phase.DECODE]).start()
    tokens, done = await collect(c.orch, job(PROMPT, 12))
    assert tokens == expected(PROMPT, 12)
    assert done.finish_reason == "length" and done.completion_tokens == 12 and done.first_phase == "decode"
    assert [r.role for r in c.w("w0").requests] == [Role.DECODE]


async def test_disaggregated_prefill_then_decode_with_block_locations():
    c = await Cluster([Phase.PREFILL, Phase.DECODE]).start()
    tokens, done = await collect(c.orch, job(PROMPT, 8))
    assert tokens == expected(PROMPT, 8)
    assert done.first_phase == "prefill" and done.nodes == ["w0", "w1"]
    (pre,) = c.w("w0").requests
    (dec,) = c.w("w1").requests
    assert pre.role is Role.PREFILL and pre.sampling.max_tokens == 1
    assert dec.prompt_token_ids == PROMPT + tokens[:1] and dec.sampling.max_tokens == 7
    # The decode node loads the prompt's 10 full blocks from the prefill node.
    assert dec.kv is not None
    assert [(b.node_id, b.slot) for b in dec.kv.load] == [("w0", i) for i in range(10)]


async def test_short_uncached_suffix_runs_on_decode_node_with_cache_hit():
    c = await Cluster([Phase.PREFILL, Phase.DECODE]).start()
    await collect(c.orch, job(PROMPT, 2, "a"))
    # Same prefix plus a short tool result: cached in the pool -> local prefill.
    follow = PROMPT + [7, 8, 9]
    tokens, done = await collect(c.orch, job(follow, 3, "b"))
    assert tokens == expected(follow, 3)
    assert done.first_phase == "decode" and done.nodes == ["w1"]
    assert done.cached_tokens == 40


async def test_migration_resumes_on_other_decode_node_without_gap_or_duplicate():
    c = await Cluster([Phase.DECODE, Phase.DECODE], delay=0.002).start()
    switched = asyncio.Event()

    async def switch_at(n: int) -> None:
        if n == 5 and not switched.is_set():
            switched.set()
            first = c.w("w0").requests[0].request_id if c.w("w0").requests else None
            target = "w0" if first else "w1"
            asyncio.create_task(c.switcher.switch(target, Phase.PREFILL, reason="test", who="test"))

    tokens, done = await collect(c.orch, job(PROMPT, 30), switch_at)
    assert tokens == expected(PROMPT, 30)
    assert done.completion_tokens == 30 and done.resumes == 1
    first_node, second_node = done.nodes
    (resumed,) = c.w(second_node).requests
    assert resumed.prompt_token_ids == PROMPT + tokens[: len(resumed.prompt_token_ids) - len(PROMPT)]
    assert resumed.sampling.max_tokens == 30 - (len(resumed.prompt_token_ids) - len(PROMPT))
    assert resumed.kv is not None and resumed.kv.load and all(b.node_id == first_node for b in resumed.kv.load)
    await asyncio.sleep(0.05)
    assert c.registry.get(first_node).phase is Phase.PREFILL


async def test_dead_decode_node_continues_elsewhere():
    c = await Cluster([Phase.DECODE, Phase.DECODE], delay=0.001).start()
    holder: dict[str, str] = {}

    async def kill_at(n: int) -> None:
        if n == 4 and not holder:
            node = "w0" if c.w("w0").requests else "w1"
            holder["dead"] = node
            c.w(node).kill()

    tokens, done = await collect(c.orch, job(PROMPT, 20), kill_at)
    assert tokens == expected(PROMPT, 20)
    assert not c.registry.get(holder["dead"]).healthy
    assert done.resumes == 1


async def test_dead_only_node_mid_stream_raises_clear_error():
    """After the bounded wait for a node to continue on (none comes back)."""
    c = await Cluster([Phase.DECODE], delay=0.001, resume_wait_s=0.2).start()

    async def kill_at(n: int) -> None:
        if n == 3:
            c.w("w0").kill()

    with pytest.raises(GatewayError) as err:
        await collect(c.orch, job(PROMPT, 20), kill_at)
    assert err.value.status in (502, 503)


async def test_dead_prefill_node_is_retried_elsewhere():
    c = await Cluster([Phase.PREFILL, Phase.PREFILL, Phase.DECODE]).start()
    c.w("w1").kill()  # the router prefers w1 (ties broken by id, highest wins)
    tokens, done = await collect(c.orch, job(PROMPT, 5))
    assert tokens == expected(PROMPT, 5)
    assert done.nodes == ["w1", "w0", "w2"] and done.first_phase == "prefill"


async def test_draining_node_rejection_is_retried():
    c = await Cluster([Phase.DECODE, Phase.DECODE]).start()
    c.w("w1").draining_to = Phase.PREFILL  # the worker refuses, the registry does not know yet
    tokens, done = await collect(c.orch, job(PROMPT, 4))
    assert tokens == expected(PROMPT, 4) and done.nodes == ["w1", "w0"]


async def test_refusals_do_not_use_up_the_failure_budget():
    # Both nodes refuse decodes at first (draining to prefill, the registry
    # does not know yet); a refusal is not a failure, so with one allowed
    # failure the request still finishes once w0's switch is cancelled.
    c = await Cluster([Phase.DECODE, Phase.DECODE]).start()
    c.orch._cfg = OrchestratorConfig(max_node_attempts=1)
    for w in ("w0", "w1"):
        c.w(w).draining_to = Phase.PREFILL

    async def cancel_w0_switch() -> None:
        await asyncio.sleep(0.05)
        c.w("w0").draining_to = None

    task = asyncio.create_task(cancel_w0_switch())
    tokens, done = await collect(c.orch, job(PROMPT, 4))
    await task
    assert tokens == expected(PROMPT, 4)
    assert done.nodes[:2] == ["w1", "w0"] and done.nodes[-1] == "w0"


async def test_attempt_budget_exhausted_raises():
    c = await Cluster([Phase.DECODE, Phase.DECODE]).start()
    c.orch._cfg = OrchestratorConfig(max_node_attempts=1)
    c.w("w1").kill()
    with pytest.raises(UpstreamFailed):
        await collect(c.orch, job(PROMPT, 4))


async def test_eos_ends_with_stop():
    c = await Cluster([Phase.DECODE]).start()
    want = expected(PROMPT, 10)
    c.w("w0").eos_token_id = want[3]
    tokens, done = await collect(c.orch, job(PROMPT, 10))
    assert tokens == want[:4] and done.finish_reason == "stop"


async def test_branch_references_prompt_and_output_blocks():
    c = await Cluster([Phase.DECODE]).start()
    assert await c.directory.open_branch("t/b1", tenant_id="t")
    tokens, _ = await collect(c.orch, job(PROMPT, 8, branch="t/b1"))
    hashes = c.directory.block_hashes(PROMPT + tokens, "t")
    assert len(hashes) == 12 and [await c.directory.references(h) for h in hashes] == [1] * 12
    assert await c.directory.finish_branch("t/b1") and await c.directory.references(hashes[0]) == 0


async def test_known_prompt_hashes_are_reused_for_lookup_and_references():
    c = await Cluster([Phase.PREFILL, Phase.DECODE]).start()
    await collect(c.orch, job(PROMPT, 2, "a"))
    follow = PROMPT + [7, 8, 9]
    await c.directory.open_branch("t/b2", tenant_id="t")
    known = c.directory.block_hashes(follow, "t")
    with_hashes = dataclasses.replace(job(follow, 3, "b", branch="t/b2"), prompt_hashes=known)
    tokens, done = await collect(c.orch, with_hashes)
    assert tokens == expected(follow, 3) and done.cached_tokens == 40
    refs = [await c.directory.references(h) for h in c.directory.block_hashes(follow + tokens, "t")]
    assert refs and all(r == 1 for r in refs)


async def test_a_branch_is_referenced_once_the_caller_closes_the_stream_after_finished():
    c = await Cluster([Phase.DECODE]).start()
    assert await c.directory.open_branch("t/b3", tenant_id="t")
    events = c.orch.stream(job(PROMPT, 8, branch="t/b3"))
    tokens: list[int] = []
    async for ev in events:
        if isinstance(ev, Finished):
            break
        tokens.extend(ev.token_ids)
    hashes = c.directory.block_hashes(PROMPT + tokens, "t")
    assert [await c.directory.references(h) for h in hashes] == [0] * 12  # the end is out first
    await events.aclose()
    assert [await c.directory.references(h) for h in hashes] == [1] * 12


async def test_a_branch_that_ends_with_its_request_references_nothing():
    c = await Cluster([Phase.DECODE]).start()
    await c.directory.open_branch("t/once", tenant_id="t")
    once = dataclasses.replace(job(PROMPT, 8, branch="t/once"), reference_blocks=False)
    tokens, _ = await collect(c.orch, once)
    refs = [await c.directory.references(h) for h in c.directory.block_hashes(PROMPT + tokens, "t")]
    assert refs and all(r == 0 for r in refs)


async def test_closing_stream_early_aborts_worker_request():
    c = await Cluster([Phase.DECODE], delay=0.002).start()
    stream = c.orch.stream(job(PROMPT, 100))
    async for _ev in stream:
        break
    await stream.aclose()
    # The worker call is closed with the stream, not later by the loop's async-generator finalizer.
    assert c.registry.get("w0").inflight == 0
    await asyncio.sleep(0.02)
    assert not c.w("w0")._running
    assert c.registry.get("w0").inflight == 0
