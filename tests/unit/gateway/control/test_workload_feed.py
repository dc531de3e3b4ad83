"""LocalWorkloadFeed: samples for the planner with each branch's turn gaps."""

from __future__ import annotations

from gateway.control.workload_feed import LocalWorkloadFeed
from planner.types import RequestSample


def sample(t: float, e2e: float) -> RequestSample:
    return RequestSample(t=t, uncached_prompt_tokens=100, cached_prompt_tokens=32, output_tokens=8, e2e_s=e2e)


def test_gaps_per_branch_from_the_previous_turns_end() -> None:
    feed = LocalWorkloadFeed()
    feed.add(sample(10.0, 2.0), branch="t/a")  # first turn: no gap
    feed.add(sample(11.0, 1.0), branch="t/b")
    feed.add(sample(15.5, 1.0), branch="t/a")  # a's first ended at 12.0
    feed.add(sample(16.0, 1.0), branch="t/a", last_in_branch=True)  # 16.0 - 16.5: overlapping counts as 0
    feed.add(sample(30.0, 1.0), branch="t/a")  # a ended: a new branch of that name starts fresh
    feed.add(sample(31.0, 1.0))  # no branch: open loop, kept as given
    assert [s.gap_s for s in feed.peek()] == [None, None, 3.5, 0.0, None, None]
    assert len(feed.drain()) == 6 and feed.drain() == []


def test_bounded() -> None:
    feed = LocalWorkloadFeed(max_samples=3)
    for i in range(5):
        feed.add(sample(float(i), 0.1))
    assert [s.t for s in feed.drain()] == [2.0, 3.0, 4.0]
