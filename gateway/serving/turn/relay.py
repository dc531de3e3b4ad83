"""A primed run of choices read as deltas: the loop every streamed answer
shares (chat and completions chunks, Responses events, Anthropic events).

`run_choices` yields `(output, delta or Finished)`; a relay wants deltas
only, a choice's `Finished` folded into its last delta by
`ChoiceOutput.finish` (held-back text, the parser's flush, the finish
reason, `finished` set). Each API encodes the deltas, reports failures and
counts the request its own way.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator

from gateway.serving.jobs import Finished
from gateway.serving.turn.choices import ChoiceDelta, ChoiceOutput

Item = tuple[ChoiceOutput, ChoiceDelta | Finished]


async def deltas(first: Item | None, events: AsyncIterator[Item]) -> AsyncGenerator[ChoiceDelta, None]:
    """`first` (the item a primed stream awaited; None: there was none),
    then the rest of `events`, as deltas in arrival order.

    The next item is awaited only when the caller asks for the next delta;
    `events` stays the caller's to close, and its failures reach the caller."""
    item = first
    while item is not None:
        out, ev = item
        yield out.finish(ev) if isinstance(ev, Finished) else ev
        item = await anext(events, None)


async def primed(events: AsyncIterator[Item]) -> Item | None:
    """The first item of a run (None: it had none), awaited before the answer
    starts, so a request the model refuses (an invalid JSON schema, a grammar
    the backend cannot compile) is a 4xx, not an error event inside a 200 stream."""
    return await anext(events, None)
