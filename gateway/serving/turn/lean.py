"""Token ids -> text, and the lean strategy of plain requests (one job, text
only): no parser, no per-token delta objects, the least work per token.
`LeanText` is its state; a streamed turn reads the orchestrator and writes
its API's plain encoder in one loop (`Turn.stream_plain`), its tokens
between the first and the last written by `PlainLane` as they arrive when
the server allows it; a collected one reads `lean_run`. Everything else
goes through `gateway.serving.turn.choices`."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable

from core import FinishReason, Phase
from gateway.http.sse import DirectBody
from gateway.serving.jobs import Finished, TokenDelta
from gateway.serving.orchestrator import Orchestrator
from gateway.serving.tokenize import PromptTokenizer, StopStringFilter
from gateway.serving.turn.prepare import Prepared


class TextAssembler:
    """Token ids -> text deltas, cut at the first stop string (no filter at
    all for a request without one: a relayed token is one detokenizer call)."""

    __slots__ = ("_detok", "_stops", "stopped")

    def __init__(self, tokenizer: PromptTokenizer, stops: list[str], *, skip_special_tokens: bool = True) -> None:
        self._detok = tokenizer.detokenizer(skip_special_tokens=skip_special_tokens)
        self._stops = StopStringFilter(stops) if any(stops) else None
        self.stopped = False  # a stop string ended the text

    @property
    def cuts(self) -> bool:
        """The request has stop strings: the text may end before the tokens do."""
        return self._stops is not None

    @property
    def matched_stop(self) -> str | None:
        return None if self._stops is None else self._stops.matched

    def push(self, token_ids: list[int]) -> str:
        return self._cut(self._detok.push(token_ids))

    @property
    def pusher(self) -> Callable[[list[int]], str]:
        """`push`, or the detokenizer's own where no stop string can cut the
        text (the same text, two calls less a relayed token)."""
        return self._detok.push if self._stops is None else self.push

    def flush(self) -> str:
        text = self._cut(self._detok.flush())
        return text if self._stops is None else text + self._stops.flush()

    def _cut(self, text: str) -> str:
        stops = self._stops
        if stops is None:
            return text
        text = stops.push(text)
        self.stopped = stops.stopped
        return text


class JobClock:
    """What a job's `Finished` needs when a stop string ends it before the
    worker does: tokens seen, cached tokens, time to the first token, its phase."""

    def __init__(self) -> None:
        self._t0 = time.monotonic()
        self.count = self.cached = 0
        self.ttft = 0.0
        self.phase = Phase.DECODE

    def seen(self, ev: TokenDelta) -> None:
        if not self.count:
            self.ttft, self.phase = time.monotonic() - self._t0, ev.phase
        self.count += len(ev.token_ids)
        self.cached = ev.cached_tokens

    def stopped(self, prompt_tokens: int) -> Finished:
        """The job ended by a stop string: finish_reason "stop"."""
        e2e = time.monotonic() - self._t0
        return Finished(FinishReason.STOP, prompt_tokens, self.cached, self.count, self.ttft, e2e, self.phase)


class LeanText:
    """One plain job's text, event by event (the lean strategy's state):
    text deltas cut at the first stop string, then the job's `Finished`."""

    __slots__ = ("_clock", "_prompt_tokens", "_push", "_text")

    def __init__(self, tokenizer: PromptTokenizer, p: Prepared) -> None:
        self._text = TextAssembler(tokenizer, p.stops)
        self._push = self._text.pusher
        self._clock = JobClock()
        self._prompt_tokens = len(p.job.prompt_token_ids)

    @property
    def stopped(self) -> bool:
        """A stop string ended the text: read no more tokens."""
        return self._text.stopped

    @property
    def cuts(self) -> bool:
        """A stop string may end the text (then each delta is checked in the relay loop)."""
        return self._text.cuts

    def delta(self, ev: TokenDelta) -> str:
        """The text `ev` adds ("" while held back)."""
        self._clock.seen(ev)
        return self._push(ev.token_ids)

    def tail(self) -> str:
        """The text still held back when the worker finished the job."""
        return self._text.flush()

    def stopped_early(self) -> Finished:
        """The job's `Finished` when the text ended before the worker finished it."""
        return self._clock.stopped(self._prompt_tokens)

    @property
    def uncut(self) -> Callable[[list[int]], str]:
        """Token ids -> the text they add, for a job no stop string can cut
        (`cuts` False): `delta` without the clock, which only a stop string's
        early end reads (the worker's `Finished` ends every other job)."""
        if self.cuts:
            raise ValueError("a job with stop strings reads its text through delta()")
        return self._push


class PlainLane:
    """A plain stream's `DeltaLane` (`Orchestrator.stream(job, lane=...)`):
    a token delta that arrives while the relay loop waits becomes its text
    event and goes to the connection at once (`DirectBody`), in the worker
    read's callback. Only for a request without stop strings (nothing can
    end its text early) and only while the response's direct way is open."""

    __slots__ = ("_encode", "_out", "_text_of", "ready")

    def __init__(self, lean: LeanText, encode: Callable[[str], bytes], out: DirectBody) -> None:
        self._text_of, self._encode, self._out = lean.uncut, encode, out
        self.ready: Callable[[], bool] = out.ready  # `DeltaLane.ready`: the response's own check, bound once

    def __call__(self, delta: TokenDelta) -> None:
        text = self._text_of(delta.token_ids)
        if text:
            self._out.write(self._encode(text))


async def lean_run(
    orchestrator: Orchestrator,
    tokenizer: PromptTokenizer,
    p: Prepared,
    account: Callable[[Finished], None],
) -> AsyncIterator[str | Finished]:
    """Text deltas, then one `Finished` (finish_reason "stop" when a stop string hit), accounted."""
    lean = LeanText(tokenizer, p)
    async with contextlib.aclosing(orchestrator.stream(p.job)) as events:
        async for ev in events:
            if isinstance(ev, TokenDelta):
                delta = lean.delta(ev)
                if delta:
                    yield delta
                if lean.stopped:
                    break
            else:
                tail = lean.tail()
                if tail:
                    yield tail
                account(ev)
                yield ev
                return
    done = lean.stopped_early()  # a stop string ended the text before the worker finished
    account(done)
    yield done
