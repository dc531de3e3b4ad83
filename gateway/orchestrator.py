"""One request end to end: route, prefill, decode, relay; resume on migration
or node death so the client sees one stream with no gap and no duplicate.

`Orchestrator.stream(job)` yields `TokenDelta`s and, last, one `Finished`.
The loop is "decide -> one worker call -> apply", repeated per *segment*:

- decide: look up the cached prefix of `prompt + generated`, route it
  (`gateway.routing.route`), excluding nodes that failed this request.
- call: a PREFILL segment (disaggregated; one token, blocks published) or a
  DECODE segment (stream to the end; KV loaded from the block locations).
- apply: append tokens; on finish_reason "migrated"/"abort" or a dead or
  refusing node, loop again: the continuation is `prompt + generated` with
  `max_tokens` reduced, so greedy output equals an uninterrupted run.

Failure contract: a node that cannot be reached is reported to the registry
and skipped; after `max_node_attempts` failures, or when no node is left,
`stream` raises a `GatewayError` (before or after tokens were yielded — the
API layer turns the latter into an SSE error event). Nothing truncates
silently: a stream that ends without "stop"/"length" is an error.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import AsyncIterator

from gateway.cache import PrefixCache
from gateway.errors import InvalidRequest, UpstreamFailed, Unavailable
from gateway.registry import WorkerRegistry
from gateway.routing import RouteRequest, RouterConfig, route
from gateway.routing.picker import NoNodeAvailable
from gateway.worker_client import WorkerAPI, WorkerRejected, WorkerUnreachable
from workers.protocol import GenerateChunk, GenerateRequest, KVTransferSpec, Role, SamplingOptions

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Job:
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingOptions
    tenant_salt: str
    branch_id: str | None = None


@dataclass(frozen=True)
class TokenDelta:
    token_ids: list[int]
    cached_tokens: int = 0  # prompt tokens served from cache (known from the first delta on)
    phase: str = "decode"  # phase of the node that produced these tokens


@dataclass(frozen=True)
class Finished:
    finish_reason: str  # "stop" | "length"
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    ttft_s: float
    e2e_s: float
    first_phase: str  # node phase that produced the first token: "prefill" | "decode"
    resumes: int = 0  # segments after the first decode (migrations, failovers)
    nodes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class OrchestratorConfig:
    router: RouterConfig = RouterConfig()
    max_node_attempts: int = 4  # failed worker calls per request before giving up
    max_migrations: int = 16  # migrations followed per request


class _Resume(Exception):
    """Internal: this segment ended early; route the continuation again."""


class Orchestrator:
    def __init__(self, registry: WorkerRegistry, client: WorkerAPI, cache: PrefixCache,
                 config: OrchestratorConfig = OrchestratorConfig()) -> None:
        self._registry = registry
        self._client = client
        self._cache = cache
        self._cfg = config
        self._background: set[asyncio.Task[object]] = set()

    async def stream(self, job: Job) -> AsyncIterator[TokenDelta | Finished]:
        t0 = time.monotonic()
        max_tokens = job.sampling.max_tokens
        generated: list[int] = []
        excluded: set[str] = set()
        nodes: list[str] = []
        failures = migrations = resumes = 0
        ttft = 0.0
        cached: int | None = None
        first_phase = ""
        just_prefilled = False
        while True:
            remaining = max_tokens - len(generated)
            if remaining <= 0:
                finish = "length"
                break
            context = job.prompt_token_ids + generated
            node_id, role, kv = self._decide(job, context, excluded, just_prefilled, record=not nodes)
            nodes.append(node_id)
            req = GenerateRequest(
                request_id=f"{job.request_id}.{len(nodes)}", prompt_token_ids=context,
                sampling=job.sampling.model_copy(update={"max_tokens": 1 if role is Role.PREFILL else remaining}),
                role=role, tenant_salt=job.tenant_salt, branch_id=job.branch_id, kv=kv)
            url = self._registry.get(node_id).url
            finish = None
            segment = self._segment(url, req)
            try:
                with self._registry.track(node_id):
                    async for chunk in segment:
                        if cached is None and (chunk.token_ids or chunk.finish_reason in ("stop", "length")):
                            cached = max(chunk.cached_tokens, chunk.external_cached_tokens)
                        if chunk.saved_blocks:
                            self._cache.publish(node_id, chunk.saved_blocks)
                        tokens = chunk.token_ids[:max_tokens - len(generated)]
                        if tokens:
                            if not generated:
                                ttft, first_phase = time.monotonic() - t0, role.value
                            generated.extend(tokens)
                            yield TokenDelta(tokens, cached or 0, role.value)
                        finish = self._apply_finish(chunk, node_id)
                        if finish is not None:
                            break
            except WorkerUnreachable as exc:
                self._registry.report_failure(node_id, str(exc), certain=exc.refused)
                failures = self._failed(job, node_id, exc, excluded, failures, generated)
                resumes += 1
                continue
            except WorkerRejected as exc:
                if not exc.retryable and 400 <= exc.status_code < 500 and exc.status_code != 409:
                    # The worker refused the request itself (prompt + max_tokens over the
                    # context, token id out of vocabulary): the client's error, not a 502.
                    raise InvalidRequest(f"the model cannot serve this request: {exc.message}",
                                         code="invalid_request_for_model") from exc
                if not exc.retryable:
                    raise
                failures = self._failed(job, node_id, exc, excluded, failures, generated)
                resumes += 1
                continue
            except _Resume:
                migrations += 1
                resumes += 1
                if migrations > self._cfg.max_migrations:
                    raise UpstreamFailed(f"request {job.request_id} migrated too often", code="too_many_migrations")
                just_prefilled = False
                continue
            finally:
                await segment.aclose()
            if finish == "stop" or (finish == "length" and role is Role.DECODE):
                break
            just_prefilled = role is Role.PREFILL
        self._remember_branch(job, generated)
        e2e = time.monotonic() - t0
        yield Finished(finish_reason=finish, prompt_tokens=len(job.prompt_token_ids), cached_tokens=cached or 0,
                       completion_tokens=len(generated), ttft_s=ttft, e2e_s=e2e, first_phase=first_phase,
                       resumes=resumes, nodes=nodes)

    # -- decide -----------------------------------------------------------------
    def _decide(self, job: Job, context: list[int], excluded: set[str], just_prefilled: bool, *,
                record: bool) -> tuple[str, Role, KVTransferSpec]:
        dead = [n.node_id for n in self._registry.nodes() if not n.healthy]
        # Only the request's first lookup counts toward the pool hit rate.
        hit = self._cache.lookup(context, job.tenant_salt, exclude=dead, record=record)
        # At least one token must be computed, so a full hit counts as len-1.
        limit = len(context) - 1
        by_node = {n: min(t, limit) for n, t in hit.cached_by_node().items()}
        loads = [n for n in self._registry.loads() if n.node_id not in excluded]
        try:
            decision = route(RouteRequest(len(context), by_node, min(hit.pool_cached_tokens, limit)),
                             loads, self._cfg.router)
        except NoNodeAvailable as exc:
            raise Unavailable(f"no worker can take request {job.request_id}: {exc}",
                              code="no_worker_available") from exc
        if decision.prefill_node is not None and not just_prefilled:
            node_id, role = decision.prefill_node, Role.PREFILL
        else:
            node_id, role = decision.decode_node, Role.DECODE
        max_blocks = limit // hit.block_size
        load = hit.locations(prefer=node_id, max_blocks=max_blocks)
        urls = {n.node_id: n.url for n in self._registry.nodes()}
        peers = {b.node_id: urls[b.node_id] for b in load if b.node_id != node_id and b.node_id in urls}
        kv = KVTransferSpec(load=load, peers=peers, save=True)
        return node_id, role, kv

    # -- call -------------------------------------------------------------------
    async def _segment(self, url: str, req: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        """PREFILL: one non-streaming call. DECODE: relay the worker's stream."""
        if req.role is Role.PREFILL:
            yield await self._client.generate(url, req)
            return
        stream = self._client.generate_stream(url, req)
        done = False
        try:
            async for chunk in stream:
                done = chunk.finish_reason is not None
                yield chunk
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
            if not done:
                # Closed early (client left or a stop string hit): free the slot now.
                self._spawn(self._abort_quietly(url, req.request_id))

    async def _abort_quietly(self, url: str, request_id: str) -> None:
        try:
            await self._client.abort(url, request_id)
        except (WorkerUnreachable, WorkerRejected):
            pass

    def _spawn(self, coro: object) -> None:
        task = asyncio.ensure_future(coro)  # type: ignore[arg-type]
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- apply ------------------------------------------------------------------
    @staticmethod
    def _apply_finish(chunk: GenerateChunk, node_id: str) -> str | None:
        reason = chunk.finish_reason
        if reason is None or reason in ("stop", "length"):
            return reason
        if reason in ("migrated", "abort"):
            # The node gave the request up (phase switch); its KV, if saved,
            # is already published. Continue elsewhere.
            raise _Resume(reason)
        raise UpstreamFailed(f"worker {node_id} failed the request: {chunk.error or reason}",
                             code="worker_error")

    def _failed(self, job: Job, node_id: str, exc: Exception, excluded: set[str], failures: int,
                generated: list[int]) -> int:
        excluded.add(node_id)
        failures += 1
        log.warning("request %s: node %s failed after %d tokens: %s", job.request_id, node_id,
                    len(generated), exc)
        if failures >= self._cfg.max_node_attempts:
            raise UpstreamFailed(
                f"request {job.request_id} failed on {failures} workers after {len(generated)} tokens; "
                f"last error: {exc}", code="workers_failed") from exc
        return failures

    def _remember_branch(self, job: Job, generated: list[int]) -> None:
        if job.branch_id is not None:
            self._cache.reference(job.branch_id,
                                  self._cache.block_hashes(job.prompt_token_ids + generated, job.tenant_salt))
