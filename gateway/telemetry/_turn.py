"""One traced request (a *turn*) and the spans the serving code opens in it.

The tracing middleware (`_middleware.py`) opens the request's SERVER span
and makes a `Turn` current (a context variable, so every task the request
starts sees it); the serving code calls the module functions here at each
span site. With tracing off, or a request the sampler dropped, no turn is
current and every function returns at once: the request path pays one
context-variable read per site.

Spans are `_lean.LeanSpan`s (the SDK's span objects cost ~15x the CPU),
started with an explicit parent (the turn's span), never made "current"
across an `await` or a `yield`: the orchestrator is an async generator,
and a context attached in one step and detached in another breaks when its
consumer changes context. A span the request left open (the client went
away mid-stream) is ended by `Turn.close` with the reason.

A turn keeps its child spans and hands them, ended, with its own span last,
to the export queue in one list when it finishes (`LeanSink.put_many`: one
encoder call for the request's spans instead of a queue call and an encoder
call for each); a span made after that goes to the queue alone when it ends.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from contextvars import ContextVar, Token
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from opentelemetry.trace import SpanKind, Status, StatusCode

from gateway.telemetry._inflight import InflightSegments
from gateway.telemetry._lean import LeanSink, LeanSpan, new_span

if TYPE_CHECKING:
    from workers.protocol import KVTransferSpec

Span = LeanSpan  # the span type of the request path
INTERNAL, CLIENT = SpanKind.INTERNAL.value, SpanKind.CLIENT.value  # `SpanKind.value` is a property call
_time_ns = time.time_ns
_NODE_ID = attrgetter("node_id")

# gen_ai.operation.name per API route (GenAI semantic conventions).
OPERATIONS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "text_completion",
    "/v1/responses": "chat",
    "/v1/messages": "chat",
}


class Turn:
    """The traced request: its span, the spans open under it, what its jobs reported."""

    __slots__ = (
        "sink",
        "put",
        "children",
        "span",
        "inflight",
        "output_tokens",
        "finish_reasons",
        "model",
        "operation",
        "relay",
        "body_started",
        "token",
    )

    def __init__(self, sink: LeanSink, span: Span, inflight: InflightSegments, operation: str) -> None:
        self.sink = sink
        self.put = sink.put  # where a span ended after the turn finished goes
        # Its child spans, open or ended, to hand over when it finishes (None: finished, handed over).
        self.children: list[Span] | None = []
        self.operation = operation
        self.span = span
        self.inflight = inflight
        self.output_tokens = 0
        self.finish_reasons: list[str] = []
        self.model = ""
        self.relay: Span | None = None  # open from the answer's first body bytes to its last
        self.body_started = False  # the answer's first body message is sent
        self.token: Token[Turn | None] | None = None  # while the turn is current (`enter`)

    def child(
        self,
        name: str,
        attributes: dict[str, Any] | None = None,
        *,
        kind: int = INTERNAL,
        start_time: int | None = None,
    ) -> Span:
        """A child of the request's span (it takes `attributes` as its own dict);
        `kind` is a `SpanKind`'s value (`INTERNAL`, `CLIENT`)."""
        parent, children = self.span, self.children
        span = new_span(
            None if children is not None else self.put,  # the turn hands its children over
            name,
            parent.trace_id,
            parent.span_id,
            kind,
            {} if attributes is None else attributes,
            start_time,
            parent.trace_state,
        )
        if children is not None:
            children.append(span)
        return span

    def end(self, span: Span, attributes: dict[str, Any] | None = None, *, error: str | None = None) -> None:
        """Ends `span` with these attributes added (once: an ended span's record stands)."""
        if span.end_time:
            return
        if attributes:
            span.attributes.update(attributes)
        if error:
            span.status = Status(StatusCode.ERROR, error)
        span.end_time = _time_ns()
        if self.children is None:  # made after the turn finished: it leaves alone
            self.put(span)

    def close(self, reason: str = "the request ended first") -> None:
        """Ends the children still open, as errors for `reason`."""
        for span in self.children or ():
            if not span.end_time:
                self.end(span, error=reason)

    # -- the answer, as the server sends it ------------------------------------------
    def responded(self, status: int) -> None:
        """The answer's status (`http.response.start`)."""
        self.span.attributes["http.response.status_code"] = status
        if status >= 500:
            self.span.status = Status(StatusCode.ERROR, f"HTTP {status}")

    def sending(self, total: int, last: bool) -> None:
        """A body message is about to be sent: `total` bytes with it, `last`
        the answer's end. A streamed answer (more than one body message) gets
        a `relay` span from its first body bytes to its last, with the bytes
        relayed. Callers may skip the messages between the first and the last."""
        relay = self.relay
        if relay is None:
            if not last and not self.body_started:  # the first body message
                self.body_started = True
                self.relay = self.child("relay")
        elif last:
            self.relay = None
            self.end(relay, {"evolving.relay.bytes": total})

    # -- the request's whole call --------------------------------------------------------
    def enter(self) -> None:
        """Makes this turn current (the span sites below find it)."""
        self.token = _TURN.set(self)

    def failed(self, exc: BaseException) -> None:
        self.span.record_exception(exc)
        self.span.status = Status(StatusCode.ERROR, type(exc).__name__)

    def finish(self) -> None:
        """The call is over: no longer current; what it left open, and its own span, end."""
        if self.token is not None:
            _TURN.reset(self.token)
            self.token = None
        self.close()
        children, span = self.children, self.span
        if children is None:  # finished before
            return
        self.children = None
        if not span.end_time:
            span.end_time = _time_ns()
            children.append(span)
        self.sink.put_many(children)


_TURN: ContextVar[Turn | None] = ContextVar("evolving_turn", default=None)


def current() -> Turn | None:
    return _TURN.get()


# -- span sites of the serving code -------------------------------------------------
def start_span(name: str, **attributes: Any) -> Span | None:
    """A child of the current request's span (None: not traced). End it with `end_span`."""
    turn = _TURN.get()
    return None if turn is None else turn.child(name, attributes)


def end_span(span: Span | None, *, error: str | None = None, **attributes: Any) -> None:
    turn = _TURN.get()
    if span is not None and turn is not None:
        turn.end(span, attributes, error=error)


def turn_started(
    *, model: str, request_id: str, tenant: str, branch: str, session: str | None, max_tokens: int, choices: int
) -> None:
    """What the request asks, once it is validated and tokenized."""
    turn = _TURN.get()
    if turn is None:
        return
    turn.model = model
    turn.span.update_name(f"{turn.operation} {model}")
    turn.span.set_attributes(
        {
            "gen_ai.request.model": model,
            "gen_ai.response.id": request_id,
            "gen_ai.request.max_tokens": max_tokens,
            "gen_ai.request.choice.count": choices,
            "evolving.tenant": tenant,
            "evolving.branch": branch,
            **({"evolving.session": session} if session else {}),
        }
    )


def turn_finished(
    *,
    prompt_tokens: int,
    cached_tokens: int,
    completion_tokens: int,
    finish_reason: str,
    first_phase: str,
    nodes: Sequence[str],
    resumes: int,
    ttft_s: float,
) -> None:
    """One job of the request finished (called once per choice)."""
    turn = _TURN.get()
    if turn is None:
        return
    turn.output_tokens += completion_tokens
    turn.finish_reasons.append(finish_reason)
    turn.span.set_attributes(
        {
            "gen_ai.response.model": turn.model,
            "gen_ai.usage.input_tokens": prompt_tokens,
            "gen_ai.usage.output_tokens": turn.output_tokens,
            "gen_ai.usage.cache_read.input_tokens": cached_tokens,
            "gen_ai.response.finish_reasons": tuple(turn.finish_reasons),
            "evolving.cached_tokens": cached_tokens,
            "evolving.first_phase": first_phase,
            "evolving.nodes": tuple(nodes),
            "evolving.resumes": resumes,
            "evolving.ttft_s": round(ttft_s, 6),
        }
    )


# -- the orchestrator's segments ------------------------------------------------------
class JobTrace:
    """Spans of one job's run through the orchestrator: routing, one span per
    worker call (prefill / decode segment, whose `traceparent` goes to the
    worker), and a live migration from the segment the node gave up to the
    call that resumes it."""

    __slots__ = ("_turn", "_job_id", "_segment", "_segment_id", "_node", "_migration", "_resumed")

    def __init__(self, turn: Turn, job_id: str) -> None:
        self._turn = turn
        self._job_id = job_id
        self._segment: Span | None = None
        self._segment_id = ""
        self._node = ""
        self._migration: Span | None = None
        self._resumed = False

    @staticmethod
    def clock() -> int:
        return _time_ns()

    def routed(
        self,
        started_ns: int,
        *,
        node_id: str,
        role: str,
        candidates: Iterable[str],
        cached_by_node: dict[str, int],
        pool_cached_tokens: int,
        context_tokens: int,
    ) -> None:
        span = self._turn.child(
            "route",
            {
                "evolving.job": self._job_id,
                "evolving.route.candidates": tuple(candidates),
                "evolving.route.node": node_id,
                "evolving.route.role": role,
                "evolving.route.context_tokens": context_tokens,
                "evolving.route.pool_cached_tokens": pool_cached_tokens,
                # sorted "node=tokens" strings: a tuple of str, which the encoder caches
                "evolving.route.cached_by_node": tuple([f"{k}={v}" for k, v in sorted(cached_by_node.items())]),
            },
            start_time=started_ns,
        )
        self._turn.end(span)

    def segment_started(
        self, segment_id: str, *, node_id: str, role: str, kv: KVTransferSpec, context_tokens: int, max_tokens: int
    ) -> str:
        """Opens the segment's span; returns its `traceparent` for the worker call."""
        if self._migration is not None:
            self._turn.end(self._migration, {"evolving.migration.to_node": node_id})
            self._migration = None
        blocks = peer_blocks = 0
        peers: tuple[str, ...] = ()
        if kv.load:
            nodes = list(map(_NODE_ID, kv.load))
            others = set(nodes)
            others.discard(node_id)
            blocks, peer_blocks, peers = len(nodes), len(nodes) - nodes.count(node_id), tuple(sorted(others))
        span = self._turn.child(
            role,
            {
                "evolving.job": self._job_id,
                "evolving.segment": segment_id,
                "evolving.node": node_id,
                "evolving.phase": role,
                "evolving.context_tokens": context_tokens,
                "gen_ai.request.max_tokens": max_tokens,
                "evolving.kv.load_blocks": blocks,
                "evolving.kv.peer_blocks": peer_blocks,
                "evolving.kv.peers": peers,
                "evolving.resumed": self._resumed,
            },
            kind=CLIENT,
        )
        self._segment, self._segment_id, self._node = span, segment_id, node_id
        self._turn.inflight.add(segment_id, node_id, span)
        return span.traceparent()

    def segment_ended(self, *, outcome: str, reason: str | None, error: str, tokens: int, cached_tokens: int) -> None:
        span = self._segment
        if span is None:
            return
        self._segment = None
        self._turn.inflight.done(self._segment_id)
        attrs = {
            "evolving.outcome": outcome,
            "evolving.generated_tokens": tokens,
            "evolving.cached_tokens": cached_tokens,
        }
        if reason:
            attrs["evolving.finish_reason"] = reason
        self._turn.end(span, attrs, error=error or None)
        if reason == "migrated":
            self._migration = self._turn.child(
                "migrate",
                {
                    "evolving.job": self._job_id,
                    "evolving.migration.from_node": self._node,
                    "evolving.generated_tokens": tokens,
                },
            )
            self._migration.add_link(span.get_span_context())
            self._resumed = True


class NoJobTrace:
    """The job trace of an untraced request: every call returns at once."""

    __slots__ = ()

    @staticmethod
    def clock() -> int:
        return 0

    def routed(self, started_ns: int, **_: Any) -> None:
        return None

    def segment_started(self, segment_id: str, **_: Any) -> None:
        return None

    def segment_ended(self, **_: Any) -> None:
        return None


NO_JOB = NoJobTrace()


def job_trace(job_id: str) -> JobTrace | NoJobTrace:
    turn = _TURN.get()
    return NO_JOB if turn is None else JobTrace(turn, job_id)
