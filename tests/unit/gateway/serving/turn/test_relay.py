"""A primed run of choices read as deltas (gateway.serving.turn.relay)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from core import FinishReason, Phase
from gateway.http.errors import UpstreamFailed
from gateway.serving.jobs import Finished
from gateway.serving.turn.choices import ChoiceDelta
from gateway.serving.turn.relay import deltas

DONE = Finished(FinishReason.STOP, 3, 0, 2, 0.0, 0.0, Phase.DECODE)


class _Output:
    """A choice whose last delta is "!" (what `ChoiceOutput.finish` would hold back)."""

    def __init__(self, index: int) -> None:
        self.index = index

    def finish(self, done: Finished) -> ChoiceDelta:
        return ChoiceDelta(self.index, text="!", finished=done, finish_reason="stop")


async def _items(items: list[Any], *, then: Exception | None = None) -> AsyncIterator[Any]:
    for item in items:
        yield item
    if then is not None:
        raise then


async def _read(first: Any, events: AsyncIterator[Any]) -> list[ChoiceDelta]:
    return [d async for d in deltas(first, events)]


async def test_a_finished_choice_ends_with_its_last_delta() -> None:
    a, b = _Output(0), _Output(1)
    rest = [(b, ChoiceDelta(1, text="y")), (a, DONE), (b, DONE)]
    got = await _read((a, ChoiceDelta(0, text="x")), _items(rest))
    assert [(d.index, d.text) for d in got] == [(0, "x"), (1, "y"), (0, "!"), (1, "!")]
    assert [d.finished for d in got] == [None, None, DONE, DONE]


async def test_no_first_item_reads_nothing_more() -> None:
    read: list[int] = []

    async def events() -> AsyncIterator[Any]:
        read.append(1)
        yield (_Output(0), DONE)

    assert await _read(None, events()) == []
    assert read == []


async def test_a_failure_of_the_run_reaches_the_caller() -> None:
    out = _Output(0)
    with pytest.raises(UpstreamFailed):
        await _read((out, ChoiceDelta(0, text="x")), _items([], then=UpstreamFailed("gone")))
