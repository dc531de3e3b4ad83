"""Token ids -> text, and the lean source of plain requests (one job, text
only): no parser, no per-token delta objects, the least work per token.
The turn streams it through its API's plain encoder; everything else goes
through `gateway.serving.turn.choices`."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable

from core import FinishReason
from gateway.serving.orchestrator import Finished, Orchestrator, TokenDelta
from gateway.serving.tokenize import PromptTokenizer, StopStringFilter
from gateway.serving.turn.prepare import Prepared


class TextAssembler:
    """Token ids -> text deltas, cut at the first stop string."""

    def __init__(self, tokenizer: PromptTokenizer, stops: list[str], *, skip_special_tokens: bool = True) -> None:
        self._detok = tokenizer.detokenizer(skip_special_tokens=skip_special_tokens)
        self._stops = StopStringFilter(stops)

    @property
    def stopped(self) -> bool:
        return self._stops.stopped

    @property
    def matched_stop(self) -> str | None:
        return self._stops.matched

    def push(self, token_ids: list[int]) -> str:
        return self._stops.push(self._detok.push(token_ids))

    def flush(self) -> str:
        return self._stops.push(self._detok.flush()) + self._stops.flush()


class JobClock:
    """What a job's `Finished` needs when a stop string ends it before the
    worker does: tokens seen, cached tokens, time to the first token, its phase."""

    def __init__(self) -> None:
        self._t0 = time.monotonic()
        self.count = self.cached = 0
        self.ttft = 0.0
        self.phase = "decode"

    def seen(self, ev: TokenDelta) -> None:
        if not self.count:
            self.ttft, self.phase = time.monotonic() - self._t0, ev.phase
        self.count += len(ev.token_ids)
        self.cached = ev.cached_tokens

    def stopped(self, prompt_tokens: int) -> Finished:
        """The job ended by a stop string: finish_reason "stop"."""
        e2e = time.monotonic() - self._t0
        return Finished(FinishReason.STOP, prompt_tokens, self.cached, self.count, self.ttft, e2e, self.phase)


async def lean_run(
    orchestrator: Orchestrator,
    tokenizer: PromptTokenizer,
    p: Prepared,
    account: Callable[[Finished], None],
) -> AsyncIterator[str | Finished]:
    """Text deltas, then one `Finished` (finish_reason "stop" when a stop string hit), accounted."""
    text = TextAssembler(tokenizer, p.stops)
    clock = JobClock()
    async with contextlib.aclosing(orchestrator.stream(p.job)) as events:
        async for ev in events:
            if isinstance(ev, TokenDelta):
                clock.seen(ev)
                delta = text.push(ev.token_ids)
                if delta:
                    yield delta
                if text.stopped:
                    break
            else:
                tail = text.flush()
                if tail:
                    yield tail
                account(ev)
                yield ev
                return
    done = clock.stopped(len(p.job.prompt_token_ids))  # a stop string ended the text before the worker finished
    account(done)
    yield done
