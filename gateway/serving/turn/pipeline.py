"""One turn: admit -> prepare -> stream or collect -> account, for every API.

A `Turn` is made for each API request before its body is read
(`TurnService.serve`) and owns the rest of its life: the admission that
holds the tenant's slot and the branch, the run through the orchestrator
(the lean text source for plain requests, the choices otherwise), priming
(the first result awaited before a streamed answer starts, so a refused
request is a 4xx), failures inside a stream (the encoder's error event),
a stream the server's shutdown cancels (`StreamCut`: the same error event,
code `gateway_shutting_down`, and a count; never a silent cut), and the
end: every finished job accounted, one `RequestRecord` and one request
count, refused requests included.

The APIs differ only in their encoder (`StreamEncoder`) and in how they
build a non-streamed answer from `collect()` / `collect_text()`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from starlette.responses import Response

from gateway.http.errors import GatewayError, StreamCut
from gateway.http.sse import DirectBody, EventStreamResponse
from gateway.serving.jobs import Finished, TokenDelta
from gateway.serving.orchestrator import Orchestrator
from gateway.serving.policy.tenancy import TenantContext
from gateway.serving.turn.accounting import Accounting
from gateway.serving.turn.admission import Admission
from gateway.serving.turn.branch import BranchContext
from gateway.serving.turn.choices import ChoiceResult, run_choices
from gateway.serving.turn.lean import LeanText, PlainLane, lean_run
from gateway.serving.turn.model import ServedModel
from gateway.serving.turn.prepare import Prepared, Preparer
from gateway.serving.turn.relay import deltas, primed
from gateway.serving.turn.requestlog import RequestRecord
from gateway.serving.turn.spec import TurnSpec

log = logging.getLogger(__name__)
CLIENT_GONE = 499  # the status recorded for a request whose client left before its answer (nginx's)


class StreamEncoder(Protocol):
    """An API's wire format for a streamed answer of choices."""

    def events(self, source: AsyncIterator[Any]) -> AsyncIterator[bytes]:
        """The answer's events for `source`, the run's `ChoiceDelta`s."""

    def failed(self, exc: GatewayError) -> bytes:
        """The event that ends a stream which failed after its first byte."""


class PlainEncoder(Protocol):
    """An API's wire format for a plain streamed answer (one job, text only),
    called once per event by the turn's relay loop: no generator of its own."""

    def start(self) -> bytes:
        """What the stream opens with (b"": nothing)."""

    def text(self, delta: str) -> bytes:
        """One text delta."""

    def end(self, tail: str, done: Finished) -> bytes:
        """The stream's last write: the held-back `tail` (may be ""), then the end for `done`."""

    def failed(self, exc: GatewayError) -> bytes:
        """The event that ends a stream which failed after its first byte."""


class Turn:
    def __init__(
        self,
        *,
        model: ServedModel,
        orchestrator: Orchestrator,
        preparer: Preparer,
        admission: Admission,
        accounting: Accounting,
        api: str,
        endpoint: str,
    ) -> None:
        self._model = model
        self._orchestrator = orchestrator
        self._preparer = preparer
        self._admission = admission
        self._accounting = accounting
        self.api = api
        self.endpoint = endpoint
        self.start = time.time()
        self._t0 = time.monotonic()
        self.tenant: TenantContext | None = None
        self.branch: BranchContext | None = None
        self.p: Prepared | None = None
        self.done: list[Finished] = []
        self.streaming = False  # the response is a stream: its end finishes the turn
        self._held: AbstractAsyncContextManager[None] | None = None  # the admission, once admitted
        self._events: AsyncGenerator[Any, None] | None = None  # a streamed run's choices
        self._finished = False

    async def authenticate(self, key: str | None) -> TenantContext:
        """The tenant of `key` (401 otherwise), recorded as the turn's."""
        self.tenant = await self._admission.gate.authenticate(key)
        return self.tenant

    async def prepare(self, spec: TurnSpec, tenant: TenantContext, branch: BranchContext, prefix: str) -> Prepared:
        self.tenant, self.branch = tenant, branch
        self.p = await self._preparer.prepare(spec, tenant, branch, prefix)
        return self.p

    @property
    def prepared(self) -> Prepared:
        if self.p is None:
            raise RuntimeError("the turn has not been prepared")
        return self.p

    def _account(self, done: Finished) -> None:
        p = self.prepared
        self.done.append(done)
        self._accounting.job_finished(p.tenant.tenant_id, p.branch, done)

    async def _admit(self) -> None:
        held = self._admission.admitted(self.prepared)
        await held.__aenter__()
        self._held = held

    async def _release(self) -> None:
        """Give back what admission holds (the tenant's slot, the branch), once."""
        held, self._held = self._held, None
        if held is not None:
            await held.__aexit__(None, None, None)

    async def collect_text(self) -> tuple[str, Finished]:
        """A plain request's whole text (the lean source) and its `Finished`."""
        await self._admit()
        parts: list[str] = []
        try:
            async for ev in lean_run(self._orchestrator, self._model.tokenizer, self.prepared, self._account):
                if isinstance(ev, str):
                    parts.append(ev)
        finally:
            await self._release()
        return "".join(parts), self.done[-1]

    async def collect(self) -> list[ChoiceResult]:
        """Every choice run to its end; results in choice order."""
        await self._admit()
        results: dict[int, ChoiceResult] = {}
        try:
            events = self._choices(streaming=False)
            try:
                async for out, ev in events:
                    if isinstance(ev, Finished):
                        results[out.index] = out.result(ev)
            finally:
                await events.aclose()
        finally:
            await self._release()
        return [results[i] for i in sorted(results)]

    def _choices(self, *, streaming: bool) -> AsyncGenerator[Any, None]:
        return run_choices(self._orchestrator, self._model.tokenizer, self.prepared, self._account, streaming=streaming)

    async def stream(self, encoder: StreamEncoder, *, headers: dict[str, str]) -> Response:
        """The streamed answer of the choices, primed."""
        await self._admit()
        events = self._choices(streaming=True)
        try:
            first = await primed(events)
        except BaseException:
            await events.aclose()
            await self._release()
            raise
        self.streaming = True
        self._events = events
        body = self._body(encoder, deltas(first, events), events)
        return EventStreamResponse(body, headers=headers, on_close=self._closed)

    async def stream_plain(self, encoder: PlainEncoder, *, headers: dict[str, str]) -> Response:
        """The streamed answer of a plain request (the lean strategy), not
        primed: the stream starts at once."""
        await self._admit()
        self.streaming = True
        direct = DirectBody()
        body = self._plain_body(encoder, direct)
        return EventStreamResponse(body, headers=headers, on_close=self._closed, direct=direct)

    async def _closed(self) -> None:
        """The response's end. A body that never started (the client left
        first) ran no `finally`: release the run and record the request here."""
        if self._events is not None:
            await self._events.aclose()
        await self._release()
        self.finish(CLIENT_GONE)

    def _failure(self, exc: Exception) -> GatewayError:
        """What a stream that failed after its first byte reports (called in its `except`)."""
        if isinstance(exc, GatewayError):
            log.warning("stream %s failed: %s", self.prepared.request_id, exc.message)
            return exc
        log.exception("stream %s crashed", self.prepared.request_id)  # reported and logged, never swallowed
        return GatewayError(f"internal error: {type(exc).__name__}")

    def _cut(self) -> StreamCut:
        """The server cancelled the stream mid-answer: uvicorn does that to
        what still runs when its graceful shutdown window closes. The
        client's connection ends with this replica, so the stream cannot
        continue elsewhere; it ends with a typed error event (the only
        write left), counted, and the cancellation goes on."""
        p = self.prepared
        log.warning("stream %s cut by the gateway's shutdown", p.request_id)
        self._accounting.stream_cut(p.tenant.tenant_id)
        return StreamCut(
            f"the gateway stopped while streaming request {p.request_id} (its shutdown grace ended); "
            "the answer is incomplete: send the request again",
        )

    async def _body(
        self, encoder: StreamEncoder, source: AsyncGenerator[Any, None], events: AsyncGenerator[Any, None]
    ) -> AsyncGenerator[bytes, None]:
        status = 200
        try:
            async for chunk in encoder.events(source):
                yield chunk
        except Exception as exc:  # noqa: BLE001  # reported to the client and logged (`_failure`), never swallowed
            failure = self._failure(exc)
            status = failure.status
            yield encoder.failed(failure)
        except asyncio.CancelledError:
            status = StreamCut.status
            yield encoder.failed(self._cut())
            raise
        finally:
            await source.aclose()
            await events.aclose()
            self.finish(status)
            await self._release()

    async def _plain_body(self, encoder: PlainEncoder, direct: DirectBody) -> AsyncGenerator[bytes, None]:
        """The plain stream in one loop: the orchestrator's events in, the
        encoder's bytes out (one generator between the worker client and the
        response, not three); the tokens that arrive while it waits written
        by the lane when the response opened `direct`. As `_body` for
        failures and the end."""
        status = 200
        p = self.prepared
        lean = LeanText(self._model.tokenizer, p)
        lane = None if lean.cuts else PlainLane(lean, encoder.text, direct)
        events = self._orchestrator.stream(p.job, lane=lane)
        try:
            head = encoder.start()
            if head:
                yield head
            tail, done = "", None
            text_of, encode = lean.delta, encoder.text  # a token's two calls
            async for ev in events:
                if isinstance(ev, TokenDelta):
                    delta = text_of(ev)
                    if delta:
                        yield encode(delta)
                    if lean.stopped:
                        break
                else:
                    tail, done = lean.tail(), ev
                    break
            if done is None:
                done = lean.stopped_early()  # a stop string ended the text before the worker finished
            try:
                yield encoder.end(tail, done)
            finally:  # after the answer's last bytes (they go out with the response's end)
                self._account(done)
        except Exception as exc:  # noqa: BLE001  # reported to the client and logged (`_failure`), never swallowed
            failure = self._failure(exc)
            status = failure.status
            yield encoder.failed(failure)
        except asyncio.CancelledError:
            status = StreamCut.status
            yield encoder.failed(self._cut())
            raise
        finally:
            await events.aclose()
            self.finish(status)
            await self._release()

    async def abort(self) -> None:
        """Release what the turn holds (a failure before its answer started)."""
        await self._release()

    def finish(self, status: int) -> None:
        """The turn's record and count, once."""
        if self._finished:
            return
        self._finished = True
        p, first = self.p, (self.done[0] if self.done else None)
        branch = self.branch
        self._accounting.request_done(
            RequestRecord(
                request_id=p.request_id if p is not None else None,
                api=self.api,
                endpoint=self.endpoint,
                tenant=self.tenant.tenant_id if self.tenant is not None else None,
                branch_id=branch.branch_id if branch is not None else None,
                session=branch.session_id if branch is not None else None,
                status=status,
                prompt_tokens=first.prompt_tokens if first else (len(p.job.prompt_token_ids) if p else 0),
                cached_tokens=first.cached_tokens if first else 0,
                output_tokens=sum(d.completion_tokens for d in self.done),
                finish_reason=first.finish_reason.value if first else None,
                start=self.start,
                duration_s=time.monotonic() - self._t0,
            )
        )


ErrorAnswer = Callable[[GatewayError], Response]
