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


async def lean_run(
    orchestrator: Orchestrator,
    tokenizer: PromptTokenizer,
    p: Prepared,
    account: Callable[[Finished], None],
) -> AsyncIterator[str | Finished]:
    """Text deltas, then one `Finished` (finish_reason "stop" when a stop string hit), accounted."""
    text = TextAssembler(tokenizer, p.stops)
    t0 = time.monotonic()
    count = cached = 0
    ttft = 0.0
    phase = "decode"
    async with contextlib.aclosing(orchestrator.stream(p.job)) as events:
        async for ev in events:
            if isinstance(ev, TokenDelta):
                if not count:
                    ttft, phase = time.monotonic() - t0, ev.phase
                count += len(ev.token_ids)
                cached = ev.cached_tokens
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
    # A stop string ended the text before the worker finished.
    done = Finished(FinishReason.STOP, len(p.job.prompt_token_ids), cached, count, ttft, time.monotonic() - t0, phase)
    account(done)
    yield done
