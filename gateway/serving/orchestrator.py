"""One request end to end: route, prefill, decode, relay; resume on migration
or node death so the client sees one stream with no gap and no duplicate.

`Orchestrator.stream(job)` yields `TokenDelta`s and, last, one `Finished`.
The loop is "decide -> one worker call -> apply", repeated per *segment*:

- decide: look up the cached prefix of `prompt + generated`, route it
  (`routing.route`), excluding nodes that failed this request.
- call: a PREFILL segment (disaggregated; one token, blocks published) or a
  DECODE segment (stream to the end; KV loaded from the block locations).
- apply (`gateway.serving.segments`, pure): append tokens; on finish reason
  MIGRATED/ABORT or a dead or refusing node, loop again: the continuation
  is `prompt + generated` with `max_tokens` reduced, so greedy output equals
  an uninterrupted run. A request whose sampling is not resumable that way
  (a structured output, penalties: `SamplingOptions.resumable`) is
  *replayed*: the continuation reruns its prompt with the same seed and
  drops the tokens already sent, checking they match. That includes the
  prefill -> decode hand-off: the decode node regenerates the prefill's
  token from the original prompt (whose KV it loads from the pool).

Engine death (`gateway.control.health`): a worker that answers
`engine_dead` / `engine_died`, or cuts a stream with an `engine_died` chunk,
is taken out of routing at once and the request continues elsewhere like
any failover. Each engine that died with the request on it counts against
the request's fingerprint (also when the worker's answer did not say so
but the registry already holds its engine dead: `_died_under`); at the second it is a poison request:
`RequestQuarantined` (500), and a later identical request is refused before
it reaches any engine. A suspect (one death so far) runs its next attempt
on a node no other suspect is on, and is acquitted when it finishes
(`SuspectIsolation`, `Quarantine.acquit`): bystanders of a poison request
are not quarantined with it.

Failure contract: a node that cannot be reached is reported to the registry
and skipped for the request until it comes back as a new incarnation (a new
process, or its engine restarted in place); after `max_node_attempts`
failures, or when no node is left, `stream` raises a `GatewayError` (before
or after tokens were yielded — the API layer turns the latter into an SSE
error event). A request under way (a segment behind it) first waits up to
`resume_wait_s` for a node: an engine restarting in place is back in tens
of seconds, and its client keeps the stream. Nothing truncates
silently: a stream that ends without "stop"/"length" is an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from core import FinishReason, Phase, Role
from gateway.control.health import NodeHealth, Quarantine, SuspectIsolation, request_fingerprint
from gateway.control.registry import WorkerRegistry
from gateway.http.errors import InvalidRequest, RequestQuarantined, Unavailable, UpstreamFailed
from gateway.kv.directory import Directory
from gateway.serving.jobs import DeltaLane, Finished, Job, TokenDelta
from gateway.serving.segments import Next, RequestProgress, SegmentOutcome, segment_outcome
from gateway.telemetry import NO_JOB, JobTrace, NoJobTrace, job_trace
from gateway.upstream.port import WorkerAPI, WorkerRejected, WorkerUnreachable
from routing import RouterConfig, RouteRequest, route
from routing.picker import NoNodeAvailable
from workers.protocol import (
    ENGINE_DEAD,
    ENGINE_DIED,
    WRONG_PHASE,
    GenerateChunk,
    GenerateRequest,
    KVTransferSpec,
)

log = logging.getLogger(__name__)
# An engine found dead this soon after it aborted a request died under it
# (the worker's own settle time for such news: workers.engine.DEATH_SETTLE_S).
ABORT_DEATH_WINDOW_S = 3.0
REFUSAL_PAUSE_S = 0.1  # the wait before asking nodes that all refused again, times the rounds so far
RESUME_POLL_S = 0.25  # how often a request under way with no node to continue on looks again


@dataclass(frozen=True)
class OrchestratorConfig:
    router: RouterConfig = RouterConfig()
    max_node_attempts: int = 4  # failed worker calls per request before giving up
    max_migrations: int = 16  # migrations followed per request
    suspect_wait_s: float = 30.0  # a suspect waits this long at most for a node no other suspect holds
    resume_wait_s: float = 60.0  # a request under way waits this long at most for a node to continue on


@dataclass(frozen=True)
class _SegmentEnd:
    """Internal: how one worker call ended (`Orchestrator._apply_chunk` and the errors of the call)."""

    outcome: SegmentOutcome
    reason: FinishReason | None = None
    error: str = ""
    engine_died: bool = False  # the node's engine died with this request on it
    refused_dead: bool = False  # refused up front: the engine was dead before the request reached it


async def _one(call: Awaitable[GenerateChunk]) -> AsyncGenerator[GenerateChunk, None]:
    """A non-streaming worker call read like a stream of one chunk."""
    yield await call


class _Fingerprint:
    """A job's quarantine identity (`request_fingerprint`), computed on first
    use: only an engine death or a quarantine that holds a poison request
    needs it, and hashing the prompt token by token cost ~10 µs a request.

    Without the seed: the gateway draws one for a sampled request with a
    grammar, so a client's retry of a poison request has another."""

    __slots__ = ("_job", "_value")

    def __init__(self, job: Job) -> None:
        self._job = job
        self._value: str | None = None

    @property
    def value(self) -> str:
        if self._value is None:
            job = self._job
            self._value = request_fingerprint(job.prompt_token_ids, job.sampling.model_dump_json(exclude={"seed"}))
        return self._value


@dataclass(slots=True)
class _JobRun:
    """Internal: one `Orchestrator.stream` call's state across its worker calls."""

    job: Job
    progress: RequestProgress
    fingerprint: _Fingerprint
    trace: JobTrace | NoJobTrace
    # (node, when) of segments a node aborted: see `_late_deaths`
    aborted: list[tuple[str, float]] = field(default_factory=list)
    # node -> its incarnation when this request failed there
    failed_on: dict[str, tuple[int, int]] = field(default_factory=dict)


class Orchestrator:
    def __init__(
        self,
        registry: WorkerRegistry,
        client: WorkerAPI,
        directory: Directory,
        config: OrchestratorConfig = OrchestratorConfig(),
        quarantine: Quarantine | None = None,
    ) -> None:
        self.quarantine = quarantine or Quarantine()
        self.isolation = SuspectIsolation()
        self._registry = registry
        self._client = client
        self._directory = directory
        self._cfg = config
        self._background: set[asyncio.Task[object]] = set()

    async def stream(self, job: Job, *, lane: DeltaLane | None = None) -> AsyncGenerator[TokenDelta | Finished, None]:
        """The job's `TokenDelta`s, then its `Finished`. Each worker call's
        chunks are read in this frame (`_apply_chunk` per chunk): a relayed
        token passes through one generator between the worker client and
        the caller, not two. With `lane`, a decode stream's plain token
        chunks go to it as they arrive, while this frame waits (`_lane`),
        when it is ready: those deltas are not yielded. The branch's blocks are
        referenced once the caller closes the stream after `Finished`."""
        t0 = time.monotonic()
        progress = RequestProgress(
            job.request_id,
            job.prompt_token_ids,
            job.sampling.max_tokens,
            max_node_failures=self._cfg.max_node_attempts,
            max_migrations=self._cfg.max_migrations,
            replay=not job.sampling.resumable,
        )
        fingerprint = _Fingerprint(job)
        self._refuse_poison(job, fingerprint)
        run = _JobRun(job, progress, fingerprint, job_trace(job.request_id))
        while not progress.budget_spent():
            node_id, req, suspect = await self._next_call(run)
            # one worker call, its chunks applied as they come
            url = self._registry.get(node_id).url
            # PREFILL: one non-streaming call; DECODE: the worker's stream
            end: _SegmentEnd | None = None
            first_step = suspect
            ended = False  # the worker sent its final chunk
            role = req.role
            phase = role.phase  # once a call, not a conversion a token
            chunks = self._call(node_id, url, req, progress, t0, None if suspect else lane)
            try:
                with self._registry.track(node_id):
                    async for chunk in chunks:
                        ended = chunk.finish_reason is not None
                        if chunk.saved_blocks:
                            await self._directory.publish(node_id, chunk.saved_blocks)
                        delta, end = self._apply_chunk(node_id, role, phase, progress, t0, chunk)
                        if delta is not None:
                            if first_step:  # through its first step here (still keeping other suspects off)
                                first_step = False
                                self.isolation.started(node_id, job.request_id)
                            yield delta
                        if end is not None:
                            break
                if end is None:  # the stream ended without a finish reason: the node cut it
                    end = _SegmentEnd(SegmentOutcome.NODE_FAILED, error="stream ended without a finish reason")
            except WorkerUnreachable as exc:
                end = self._unreachable(node_id, req, progress, exc)
            except WorkerRejected as exc:
                end = self._refused(node_id, req, exc)
            finally:
                held = job.request_id if suspect else None
                await self._call_closed(chunks, node_id, url, req, ended=ended, suspect_job=held)
            if self._segment_ended(run, node_id, role, end) is Next.DONE:
                break
        if self.quarantine.any_deaths and self.quarantine.deaths(fingerprint.value):
            self.quarantine.acquit(fingerprint.value)  # it finished on an engine: a bystander, not the poison
        try:  # the answer's last bytes do not wait on the directory (a Redis round trip with replicas)
            yield Finished(
                finish_reason=progress.finish,
                prompt_tokens=len(job.prompt_token_ids),
                cached_tokens=progress.cached or 0,
                completion_tokens=len(progress.generated),
                ttft_s=progress.ttft_s,
                e2e_s=time.monotonic() - t0,
                first_phase=progress.first_phase,
                resumes=progress.resumes,
                nodes=progress.nodes,
            )
        finally:
            await self._remember_branch(job, progress.generated)

    async def _next_call(self, run: _JobRun) -> tuple[str, GenerateRequest, bool]:
        """Decide the job's next worker call: (node, its request, whether the
        job is a suspect held apart from other suspects on that node)."""
        job, progress, fingerprint, trace = run.job, run.progress, run.fingerprint, run.trace
        if run.aborted:
            self._late_deaths(job, fingerprint, run.aborted)
        suspect = self.quarantine.any_deaths and self.quarantine.deaths(fingerprint.value) > 0
        node_id, role, kv = await self._routed(job, progress, trace, suspect=suspect, failed_on=run.failed_on)
        if suspect:
            self.isolation.hold(node_id, job.request_id)
        segment_id, max_tokens = progress.next_call(role)
        progress.started(node_id)
        # min_tokens counts from the request's start: what the prompt already carries counts
        min_tokens = min(max(0, job.sampling.min_tokens - progress.carried), max_tokens)
        sampling = job.sampling
        if (max_tokens, min_tokens) != (sampling.max_tokens, sampling.min_tokens):  # no copy for a first decode
            sampling = sampling.model_copy(update={"max_tokens": max_tokens, "min_tokens": min_tokens})
        # Built from validated parts (see Job): no validation pass over the prompt
        # on the loop (24 ms for a 661k-token prompt).
        req = GenerateRequest.model_construct(
            request_id=segment_id,
            prompt_token_ids=progress.context(),
            sampling=sampling,
            role=role,
            tenant_salt=job.tenant_salt,
            branch_id=job.branch_id,
            kv=kv,
        )
        req.traceparent = trace.segment_started(
            segment_id,
            node_id=node_id,
            role=role.value,
            kv=kv,
            context_tokens=len(req.prompt_token_ids),
            max_tokens=max_tokens,
        )
        return node_id, req, suspect

    def _segment_ended(self, run: _JobRun, node_id: str, role: Role, end: _SegmentEnd) -> Next:
        """Apply how a worker call ended; what the job does next."""
        progress = run.progress
        run.trace.segment_ended(
            outcome=end.outcome.value,
            reason=end.reason.value if end.reason is not None else None,
            error=end.error,
            tokens=len(progress.generated),
            cached_tokens=progress.cached or 0,
        )
        self._count_death(run.job, run.fingerprint, node_id, end, run.aborted)
        if end.outcome is SegmentOutcome.NODE_FAILED:
            failed = self._registry.find(node_id)
            run.failed_on[node_id] = failed.incarnation if failed is not None else (-1, -1)
        return progress.end_segment(end.outcome, role, reason=end.reason, node_id=node_id, error=end.error)

    def _refuse_poison(self, job: Job, fingerprint: _Fingerprint) -> None:
        if not self.quarantine.quarantined:
            return  # no request ever became poison: none is now (and no fingerprint is needed)
        if self.quarantine.is_poison(fingerprint.value):
            raise RequestQuarantined(
                f"request {job.request_id} is quarantined: worker engines died with it running "
                f"({self.quarantine.deaths(fingerprint.value)} so far); it is not retried on other workers",
            )

    # -- decide -----------------------------------------------------------------
    async def _routed(
        self,
        job: Job,
        progress: RequestProgress,
        trace: JobTrace | NoJobTrace,
        *,
        suspect: bool,
        failed_on: dict[str, tuple[int, int]],
    ) -> tuple[str, Role, KVTransferSpec]:
        """The next segment's node. A node this request failed on is taken
        again once it is a new incarnation. When no node can take a request
        with a segment behind it, it waits (polled) at most `resume_wait_s`;
        a first segment fails at once (nothing of it was sent)."""
        deadline: float | None = None
        while True:
            if failed_on:
                self._readmit(progress, failed_on)
            try:
                if suspect:
                    return await self._decide_suspect(job, progress, trace)
                return await self._decide(job, progress, trace)
            except Unavailable:
                if progress.first_segment:
                    raise
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self._cfg.resume_wait_s
                    log.warning(
                        "request %s: no node to continue on; waiting up to %gs", job.request_id, self._cfg.resume_wait_s
                    )
                if now >= deadline:
                    raise
            await asyncio.sleep(RESUME_POLL_S)

    def _readmit(self, progress: RequestProgress, failed_on: dict[str, tuple[int, int]]) -> None:
        """Nodes this request failed on that came back healthy as a new incarnation: routable again for it."""
        for node_id, seen in list(failed_on.items()):
            node = self._registry.find(node_id)
            if node is not None and node.healthy and node.incarnation != seen:
                progress.readmit(node_id)
                del failed_on[node_id]

    async def _decide_suspect(
        self, job: Job, progress: RequestProgress, trace: JobTrace | NoJobTrace
    ) -> tuple[str, Role, KVTransferSpec]:
        """`_decide` avoiding the nodes other suspects hold; when every node is
        held, wait for one (polled), at most `suspect_wait_s`, then any node.
        A node another suspect took while this one decided (the decision
        awaits the directory) is decided again: the caller holds the node
        it gets before the loop runs anything else."""
        deadline = time.monotonic() + self._cfg.suspect_wait_s
        while True:
            avoid = self.isolation.held()
            try:
                decision = await self._decide(job, progress, trace, avoid=avoid)
            except Unavailable:
                if not avoid:
                    raise
                if time.monotonic() >= deadline:
                    return await self._decide(job, progress, trace)
            else:
                if decision[0] not in self.isolation.held():
                    return decision
            await asyncio.sleep(0.02)

    async def _decide(
        self,
        job: Job,
        progress: RequestProgress,
        trace: JobTrace | NoJobTrace = NO_JOB,
        avoid: frozenset[str] = frozenset(),
    ) -> tuple[str, Role, KVTransferSpec]:
        started = trace.clock()
        context = progress.context()
        candidates = self._registry.loads()
        rounds = progress.refusal_rounds
        excluded = progress.skip({n.node_id for n in candidates}) | avoid
        if progress.refusal_rounds != rounds:
            # Every node had turned the request down (phases moving): ask again
            # once the heartbeats have caught up a little.
            await asyncio.sleep(min(REFUSAL_PAUSE_S * progress.refusal_rounds, 1.0))
        dead = [n.node_id for n in self._registry.nodes() if not n.healthy]
        # Only the request's first lookup counts toward the pool hit rate.
        hit = await self._directory.lookup(
            context, job.tenant_salt, exclude=dead, record=progress.first_segment, known=job.prompt_hashes
        )
        # At least one token must be computed, so a full hit counts as len-1.
        limit = len(context) - 1
        by_node = {n: min(t, limit) for n, t in hit.cached_by_node().items()}
        loads = [n for n in candidates if n.node_id not in excluded]
        try:
            decision = route(
                RouteRequest(len(context), by_node, min(hit.pool_cached_tokens, limit)), loads, self._cfg.router
            )
        except NoNodeAvailable as exc:
            raise Unavailable(
                f"no worker can take request {job.request_id}: {exc}", code="no_worker_available"
            ) from exc
        if decision.prefill_node is not None and not progress.just_prefilled:
            node_id, role = decision.prefill_node, Role.PREFILL
        else:
            node_id, role = decision.decode_node, Role.DECODE
        max_blocks = limit // hit.block_size
        load = hit.locations(prefer=node_id, max_blocks=max_blocks)
        urls = {n.node_id: n.url for n in self._registry.nodes()}
        peers = {b.node_id: urls[b.node_id] for b in load if b.node_id != node_id and b.node_id in urls}
        # From validated parts (the directory's BlockLocations, the registry's URLs): no validation pass.
        kv = KVTransferSpec.model_construct(load=load, peers=peers, save=True)
        trace.routed(
            started,
            node_id=node_id,
            role=role.value,
            candidates=[n.node_id for n in loads],
            cached_by_node=by_node,
            pool_cached_tokens=min(hit.pool_cached_tokens, limit),
            context_tokens=len(context),
        )
        return node_id, role, kv

    # -- call -------------------------------------------------------------------
    def _call(
        self, node_id: str, url: str, req: GenerateRequest, progress: RequestProgress, t0: float, lane: DeltaLane | None
    ) -> AsyncIterator[GenerateChunk]:
        """One worker call's chunks: PREFILL one non-streaming call; DECODE the
        worker's stream, its plain chunks offered to `lane` (`_lane`)."""
        if req.role is Role.PREFILL:
            return _one(self._client.generate(url, req))
        offer = None if lane is None else self._lane(lane, req.role, progress, t0)
        return self._client.generate_stream(url, req, lane=offer)

    def _lane(
        self, lane: DeltaLane, role: Role, progress: RequestProgress, t0: float
    ) -> Callable[[GenerateChunk], bool]:
        """The `ChunkLane` of one decode call: a chunk with tokens and nothing
        else to act on (no finish, saved blocks or logprobs: `_apply_chunk`'s
        one branch left, applied here) has its delta handed to `lane`, when
        `lane` is ready; any other chunk is refused untouched, for `stream`'s
        own loop. Not for a suspect's call (its first step is watched in the loop)."""
        phase = role.phase
        ready, take, absorb = lane.ready, lane.__call__, progress.absorb  # bound once: plain calls a token

        def offer(chunk: GenerateChunk) -> bool:
            if chunk.finish_reason is not None or chunk.saved_blocks or chunk.logprobs is not None or not ready():
                return False
            cached, elapsed = max(chunk.cached_tokens, chunk.external_cached_tokens), time.monotonic() - t0
            _, tokens = absorb(chunk.token_ids, cached_tokens=cached, finish=None, role=role, elapsed_s=elapsed)
            if tokens:
                take(TokenDelta(tokens, progress.cached or 0, phase))
            return True

        return offer

    def _apply_chunk(
        self, node_id: str, role: Role, phase: Phase, progress: RequestProgress, t0: float, chunk: GenerateChunk
    ) -> tuple[TokenDelta | None, _SegmentEnd | None]:
        """One chunk of a worker call to `node_id` as `role` (`phase`: its phase,
        read once a call): the client's token delta (None: none new) and how
        the call ended (None: it goes on). Raises `UpstreamFailed` when the
        worker failed the request."""
        finish = chunk.finish_reason
        if finish is FinishReason.ERROR:
            if chunk.error_type in (ENGINE_DEAD, ENGINE_DIED):
                self._registry.report_engine_dead(node_id, chunk.error or "engine dead")
                died = _SegmentEnd(
                    SegmentOutcome.NODE_FAILED,
                    error=f"engine of {node_id} died: {chunk.error}",
                    engine_died=chunk.error_type == ENGINE_DIED,
                )
                return None, died
            raise UpstreamFailed(f"worker {node_id} failed the request: {chunk.error or 'error'}", code="worker_error")
        start, tokens = progress.absorb(
            chunk.token_ids,
            cached_tokens=max(chunk.cached_tokens, chunk.external_cached_tokens),
            finish=finish,
            role=role,
            elapsed_s=time.monotonic() - t0,
        )
        delta = None
        if tokens:
            lps = chunk.logprobs[start : start + len(tokens)] if chunk.logprobs is not None else None
            delta = TokenDelta(tokens, progress.cached or 0, phase, lps)
        if finish is None:
            return delta, None
        outcome = segment_outcome(finish)
        return delta, (None if outcome is None else _SegmentEnd(outcome, finish))

    def _unreachable(
        self, node_id: str, req: GenerateRequest, progress: RequestProgress, exc: WorkerUnreachable
    ) -> _SegmentEnd:
        self._registry.report_failure(node_id, str(exc), certain=exc.refused)
        log.warning(
            "request %s: node %s failed after %d tokens: %s", req.request_id, node_id, len(progress.generated), exc
        )
        return _SegmentEnd(SegmentOutcome.NODE_FAILED, error=str(exc))

    async def _call_closed(
        self,
        chunks: AsyncIterator[GenerateChunk],
        node_id: str,
        url: str,
        req: GenerateRequest,
        *,
        ended: bool,
        suspect_job: str | None,
    ) -> None:
        """A worker call is over, however it ended: its stream closed, the
        node told to drop a decode it did not finish (the client left, a stop
        string hit, the node failed), a suspect's hold on the node released
        (`suspect_job`: its request id)."""
        try:
            await chunks.aclose()  # type: ignore[attr-defined]  # the port's streams are async generators
        finally:
            if req.role is Role.DECODE and not ended:
                self._spawn(self._abort_quietly(url, req.request_id))
            if suspect_job is not None:
                self.isolation.release(node_id, suspect_job)

    def _died_under(self, node_id: str, end: _SegmentEnd) -> bool:
        """A segment that ended unfinished without its worker saying
        `engine_died`, on a node whose engine the registry now knows dead
        (its heartbeat saw the death first; the call ended cut, unfinished,
        aborted by a switch as the core went, or `engine_dead` mid-stream):
        the engine died with the request on it all the same. Not a refusal
        before it ran (`engine_dead` answered up front)."""
        if end.outcome in (SegmentOutcome.FINISHED, SegmentOutcome.REFUSED) or end.refused_dead:
            return False
        node = self._registry.find(node_id)
        return node is not None and node.health is NodeHealth.ENGINE_DEAD

    def _count_death(
        self, job: Job, fingerprint: _Fingerprint, node_id: str, end: _SegmentEnd, aborted: list[tuple[str, float]]
    ) -> None:
        """A death under the request counts toward its quarantine (raises
        `RequestQuarantined` once it is poison); an abort is remembered for
        `_late_deaths`."""
        if end.engine_died or self._died_under(node_id, end):
            self.quarantine.record_death(fingerprint.value)
            self._refuse_poison(job, fingerprint)
        elif end.outcome is SegmentOutcome.GAVE_UP and end.reason is FinishReason.ABORT:
            aborted.append((node_id, self._registry.now()))

    def _late_deaths(self, job: Job, fingerprint: _Fingerprint, aborted: list[tuple[str, float]]) -> None:
        """Deaths learnt after the segment ended: a node that aborted the
        request (a switch's abort of a prefill in its last step) whose engine
        is found dead since within `ABORT_DEATH_WINDOW_S` of the abort. The
        abort reached the gateway before the death did, but the step that
        killed the engine ran this request. Each counts once (removed)."""
        found = 0
        for entry in list(aborted):
            node_id, at = entry
            node = self._registry.find(node_id)
            since = node.unhealthy_since if node is not None else None
            if (
                node is not None
                and node.health is NodeHealth.ENGINE_DEAD
                and since is not None
                and at - 0.5 <= since <= at + ABORT_DEATH_WINDOW_S
            ):
                aborted.remove(entry)
                self.quarantine.record_death(fingerprint.value)
                found += 1
        if found:
            self._refuse_poison(job, fingerprint)

    def _refused(self, node_id: str, req: GenerateRequest, exc: WorkerRejected) -> _SegmentEnd:
        """A worker's refusal: the client's error (raised), a failure (raised), or a node to avoid."""
        if not exc.retryable and 400 <= exc.status_code < 500 and exc.status_code != 409:
            # The worker refused the request itself (prompt + max_tokens over the
            # context, token id out of vocabulary, a schema its grammar backend
            # cannot compile): the client's error, not a 502, in the worker's words.
            code = "invalid_structured_output" if exc.error_type == "invalid_structured_output" else None
            raise InvalidRequest(exc.detail, code=code or "invalid_request_for_model") from exc
        if not exc.retryable:
            raise exc
        log.warning("request %s: node %s refused it: %s", req.request_id, node_id, exc)
        if exc.error_type == WRONG_PHASE or exc.status_code == 429:
            # Switching phase (or full): not a failure of the node; it is asked again later.
            return _SegmentEnd(SegmentOutcome.REFUSED, error=str(exc))
        if exc.error_type in (ENGINE_DEAD, ENGINE_DIED):
            self._registry.report_engine_dead(node_id, exc.detail)
        return _SegmentEnd(
            SegmentOutcome.NODE_FAILED,
            error=str(exc),
            engine_died=exc.error_type == ENGINE_DIED,
            refused_dead=exc.error_type == ENGINE_DEAD,
        )

    async def _abort_quietly(self, url: str, request_id: str) -> None:
        with contextlib.suppress(WorkerUnreachable, WorkerRejected):
            await self._client.abort(url, request_id)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- apply ------------------------------------------------------------------
    async def _remember_branch(self, job: Job, generated: list[int]) -> None:
        if job.branch_id is not None and job.reference_blocks:
            hashes = self._directory.block_hashes(
                job.prompt_token_ids + generated, job.tenant_salt, known=job.prompt_hashes
            )
            await self._directory.reference(job.branch_id, hashes)
