"""A worker whose engine dies (the process lives): out of routing at once,
its requests continue elsewhere with no lost or duplicated token, and a
request that kills a second engine is quarantined (fake workers)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from core import Phase
from gateway.control.health import NodeHealth, request_fingerprint
from gateway.http.errors import RequestQuarantined, Unavailable
from gateway.serving.orchestrator import OrchestratorConfig
from gateway.serving.segments import RequestProgress
from gateway.settings import GatewaySettings
from gateway.telemetry import NO_JOB
from tests.unit.gateway.serving.test_orchestrator import PROMPT, Cluster, collect, expected, job
from workers.protocol import SamplingOptions


async def test_engine_death_mid_stream_continues_elsewhere():
    c = await Cluster([Phase.DECODE, Phase.DECODE], delay=0.001).start()
    dead: list[str] = []

    async def kill_at(n: int) -> None:
        if n == 5 and not dead:
            node = "w0" if c.w("w0").requests else "w1"
            dead.append(node)
            c.w(node).kill_engine()

    tokens, done = await collect(c.orch, job(PROMPT, 20), kill_at)
    assert tokens == expected(PROMPT, 20)  # nothing lost, nothing twice
    assert done.resumes == 1 and done.nodes[-1] != dead[0]
    node = c.registry.get(dead[0])
    assert not node.healthy and node.health is NodeHealth.ENGINE_DEAD  # without waiting for a heartbeat
    j = job(PROMPT, 20)
    fp = request_fingerprint(j.prompt_token_ids, j.sampling.model_dump_json(exclude={"seed"}))
    assert c.orch.quarantine.deaths(fp) == 0  # it finished on another engine: acquitted
    assert not c.orch.quarantine.quarantined  # one death is not poison


async def test_heartbeat_reports_dead_engine_and_its_return():
    c = await Cluster([Phase.DECODE, Phase.DECODE]).start()
    c.w("w1").kill_engine()
    await c.registry.poll_once()
    node = c.registry.get("w1")
    assert (node.healthy, node.health, node.engine) == (False, NodeHealth.ENGINE_DEAD, "dead")
    assert c.registry.healthy_count() == 1
    _, done = await collect(c.orch, job(PROMPT, 5))
    assert done.nodes == ["w0"]
    c.w("w1").restart_engine()
    await c.registry.poll_once()
    assert c.registry.get("w1").healthy and c.registry.get("w1").engine == "alive"


async def test_poison_request_kills_two_engines_then_is_refused():
    c = await Cluster([Phase.DECODE, Phase.DECODE, Phase.DECODE], delay=0.001).start()
    poison_prompt = [7] * 40
    for w in c.workers.values():
        w.poison = lambda req: req.prompt_token_ids[:40] == poison_prompt
    with pytest.raises(RequestQuarantined) as err:
        await collect(c.orch, job(poison_prompt, 10, rid="poison"))
    assert err.value.status == 500 and err.value.code == "request_quarantined"
    assert "quarantined" in err.value.message
    assert sum(w.engine_dead for w in c.workers.values()) == 2  # never a third engine
    sent = sum(len(w.requests) for w in c.workers.values())
    retry = dataclasses.replace(job(poison_prompt, 10, rid="retry"), sampling=SamplingOptions(max_tokens=10, seed=5))
    with pytest.raises(RequestQuarantined):  # a client's retry (another drawn seed) reaches no engine
        await collect(c.orch, retry)
    assert sum(len(w.requests) for w in c.workers.values()) == sent
    # other requests still run on the engine left
    tokens, done = await collect(c.orch, job(PROMPT, 5, rid="fine"))
    assert tokens == expected(PROMPT, 5) and len(done.nodes) == 1


async def test_dead_prefill_engine_is_routed_around():
    c = await Cluster([Phase.PREFILL, Phase.PREFILL, Phase.DECODE], local_max=2).start()
    c.w("w0").kill_engine()
    c.w("w1").kill_engine()
    tokens, done = await collect(c.orch, job(PROMPT, 6))
    assert tokens == expected(PROMPT, 6)
    assert done.nodes[-1] == "w2"
    assert c.registry.healthy_count() == 1


async def test_a_heartbeat_asked_before_the_death_does_not_revive_the_node():
    c = await Cluster([Phase.DECODE, Phase.DECODE]).start()
    gate = asyncio.Event()
    real_stats = c.client.stats

    async def slow_stats(url: str, since: int = 0):
        answer = await real_stats(url, since)  # the worker answers "alive" now...
        await gate.wait()  # ...and the answer arrives late
        return answer

    # A slow heartbeat stand-in replaces the fake client's method.
    c.client.stats = slow_stats  # type: ignore[method-assign]
    poll = asyncio.create_task(c.registry.poll_once())
    await asyncio.sleep(0.01)
    c.registry.report_engine_dead("w1", "the engine core has stopped")
    gate.set()
    await poll
    assert c.registry.get("w1").health is NodeHealth.ENGINE_DEAD


async def test_bystanders_of_a_poison_request_are_not_quarantined_with_it():
    # Three bystanders stream on w0 (the only engine in routing); the poison
    # reaches w0 too and kills it; all four move to w1/w2. Isolated there,
    # the poison kills its second engine alone and is quarantined; every
    # bystander finishes with its whole answer, and is acquitted.
    c = await Cluster([Phase.DECODE, Phase.DECODE, Phase.DECODE], delay=0.005).start()
    poison_prompt = [7] * 40
    for w in c.workers.values():
        w.poison = lambda req: req.prompt_token_ids[:40] == poison_prompt
    c.w("w1").kill_engine()
    c.w("w2").kill_engine()
    await c.registry.poll_once()
    prompts = [list(range(100 + 50 * i, 140 + 50 * i)) for i in range(3)]
    started = asyncio.Event()

    async def on_token(n: int) -> None:
        if n == 3:
            started.set()

    bystanders = [
        asyncio.create_task(collect(c.orch, job(p, 40, rid=f"b{i}"), on_token)) for i, p in enumerate(prompts)
    ]
    await started.wait()
    c.w("w1").restart_engine()
    c.w("w2").restart_engine()
    poison = asyncio.create_task(collect(c.orch, job(poison_prompt, 10, rid="poison")))
    await c.registry.poll_once()  # w1, w2 back in routing before the poison's first step on w0
    with pytest.raises(RequestQuarantined):
        await poison
    for p, (tokens, done) in zip(prompts, await asyncio.gather(*bystanders), strict=True):
        assert tokens == expected(p, 40) and done.resumes >= 1
    assert sum(w.engine_dead for w in c.workers.values()) == 2
    assert c.orch.quarantine.quarantined == 1
    for i, p in enumerate(prompts):
        j = job(p, 40, rid=f"b{i}")
        assert c.orch.quarantine.deaths(request_fingerprint(p, j.sampling.model_dump_json(exclude={"seed"}))) == 0
    assert not c.orch.isolation.held()


def test_suspect_isolation_holds_and_releases_per_request():
    from gateway.control.health import SuspectIsolation

    iso = SuspectIsolation()
    iso.hold("w1", "a")
    iso.hold("w2", "b")
    iso.release("w1", "b")  # not its hold
    assert iso.held() == {"w1", "w2"}
    iso.release("w1", "a")
    assert iso.held() == {"w2"}
    iso.started("w2", "b")  # its first token: past its first step, still on w2
    iso.hold("w3", "c")
    iso.started("w3", "c")
    iso.started("w3", "d")  # two suspects may run on one node (placed there when none was free)
    assert iso.held() == {"w2", "w3"}
    iso.release("w2", "b")
    iso.release("w3", "c")
    assert iso.held() == {"w3"}
    iso.release("w3", "d")
    assert not iso.held()


async def test_a_death_the_heartbeat_saw_first_counts_toward_quarantine():
    """The workers cut a dying engine's streams without saying `engine_died`,
    after their heartbeat already reported the engine dead: the deaths
    still count, so the poison is refused before a third engine."""
    c = await Cluster([Phase.DECODE, Phase.DECODE, Phase.DECODE], delay=0.001).start()
    poison_prompt = [7] * 40
    for w in c.workers.values():
        w.poison = lambda req: req.prompt_token_ids[:40] == poison_prompt
        w.death_cut_s = 0.1
    heartbeat = asyncio.ensure_future(c.registry.run(0.01))
    try:
        with pytest.raises(RequestQuarantined):
            await collect(c.orch, job(poison_prompt, 10, rid="poison"))
    finally:
        heartbeat.cancel()
    assert sum(w.engine_dead for w in c.workers.values()) == 2  # never a third engine


async def test_an_abort_in_the_step_its_engine_died_in_counts_as_a_death():
    # The first node aborts the poison (a switch) and its engine dies just
    # after: the abort reaches the gateway before any news of the death, which
    # only the heartbeat brings. The second node's engine dies under the
    # poison too: two deaths, so it is quarantined before a third engine.
    c = await Cluster([Phase.DECODE, Phase.DECODE, Phase.DECODE], delay=0.01).start()
    poison_prompt = [7] * 40
    first: list[str] = []
    loop = asyncio.get_running_loop()

    def poisoned(w):
        def check(req) -> bool:
            if req.prompt_token_ids[:40] != poison_prompt:
                return False
            if not first:
                first.append(w.node_id)
                w._running[req.request_id].abort = True  # the stream ends "abort" now ...
                loop.call_later(0.005, w.kill_engine)  # ... and the engine dies right after
                return False
            return True

        return check

    for w in c.workers.values():
        w.poison = poisoned(w)

    async def heartbeat() -> None:
        while True:
            await c.registry.poll_once()
            await asyncio.sleep(0.002)

    beat = asyncio.create_task(heartbeat())
    try:
        with pytest.raises(RequestQuarantined):
            await collect(c.orch, job(poison_prompt, 10, rid="poison"))
    finally:
        beat.cancel()
    assert sum(w.engine_dead for w in c.workers.values()) == 2  # the aborting node and one more, never a third


async def test_two_suspects_deciding_at_once_never_share_a_node():
    # Both decide while the other's decision awaits the directory: without a
    # second look at the holds both would take the same (best) node, and a
    # poison there would kill the engine under the bystander too.
    c = await Cluster([Phase.DECODE, Phase.DECODE, Phase.DECODE]).start()
    decide = c.orch._decide

    async def slow_decide(*args, **kwargs):
        await asyncio.sleep(0.01)
        return await decide(*args, **kwargs)

    c.orch._decide = slow_decide  # type: ignore[method-assign]

    async def place(rid: str) -> str:
        j = job(PROMPT, 4, rid=rid)
        progress = RequestProgress(rid, j.prompt_token_ids, 4, max_node_failures=4, max_migrations=4)
        node, _, _ = await c.orch._decide_suspect(j, progress, NO_JOB)
        c.orch.isolation.hold(node, rid)
        return node

    a, b = await asyncio.gather(place("s1"), place("s2"))
    assert a != b


async def test_a_suspects_first_step_avoids_a_node_where_another_suspect_runs():
    # `bench chaos`: a bystander of the poison's first death was decoding on
    # w0 (past its first step there) when the poison's next attempt went to
    # w0 too; the poison killed w0 under it, its second death: quarantined.
    c = await Cluster([Phase.DECODE, Phase.DECODE]).start()
    best = c.orch._decide
    j = job(PROMPT, 4, rid="poison")

    def progress() -> RequestProgress:
        return RequestProgress("poison", j.prompt_token_ids, 4, max_node_failures=4, max_migrations=4)

    first, _, _ = await best(j, progress(), NO_JOB)  # where the poison would go with no suspect about
    c.orch.isolation.hold(first, "bystander")
    c.orch.isolation.started(first, "bystander")  # decoding there, its first step done
    node, _, _ = await c.orch._decide_suspect(j, progress(), NO_JOB)
    assert node != first


async def test_a_stream_on_the_only_node_waits_for_its_engine_and_continues():
    """One node; its engine dies mid-stream and is restarted in place: the
    request waits for it, then continues there (a new incarnation) with no
    lost or duplicated token."""
    c = await Cluster([Phase.DECODE], delay=0.001).start()

    async def restart_soon() -> None:
        await asyncio.sleep(0.4)
        c.w("w0").restart_engine()
        await c.registry.poll_once()

    restarts: list[asyncio.Task[None]] = []

    async def kill_at(n: int) -> None:
        if n == 5 and not restarts:
            c.w("w0").kill_engine()
            restarts.append(asyncio.ensure_future(restart_soon()))

    tokens, done = await collect(c.orch, job(PROMPT, 20), kill_at)
    assert tokens == expected(PROMPT, 20)
    assert done.nodes == ["w0", "w0"] and done.resumes == 1
    assert c.registry.get("w0").engine_restarts == 1


async def test_the_wait_for_a_node_to_continue_on_is_bounded():
    c = await Cluster([Phase.DECODE], delay=0.001, resume_wait_s=0.3).start()

    async def kill_at(n: int) -> None:
        if n == 5:
            c.w("w0").kill_engine()  # never restarted

    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(Unavailable) as err:
        await collect(c.orch, job(PROMPT, 20), kill_at)
    assert err.value.code == "no_worker_available" and 0.3 <= loop.time() - t0 < 2.0


async def test_a_first_segment_with_no_node_fails_at_once():
    c = await Cluster([Phase.DECODE], resume_wait_s=30.0).start()
    c.w("w0").kill_engine()
    await c.registry.poll_once()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(Unavailable):
        await collect(c.orch, job(PROMPT, 5))
    assert loop.time() - t0 < 1.0  # nothing of it was sent: the client retries, no wait


def test_a_readmitted_node_is_no_longer_skipped():
    progress = RequestProgress("r", [1, 2, 3], 10, max_node_failures=4, max_migrations=4)
    progress.excluded.add("w0")
    assert progress.skip({"w0", "w1"}) == {"w0"}
    progress.readmit("w0")
    assert progress.skip({"w0", "w1"}) == set()


def test_the_resume_wait_is_a_setting():
    assert GatewaySettings.from_env({"EVOLVING_RESUME_WAIT_S": "7.5"}).resume_wait_s == 7.5
    assert GatewaySettings.from_env({}).resume_wait_s == OrchestratorConfig().resume_wait_s
    with pytest.raises(ValueError, match="resume_wait_s"):
        GatewaySettings(resume_wait_s=-1)
