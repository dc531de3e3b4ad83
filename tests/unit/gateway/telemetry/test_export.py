"""gateway.telemetry._export: spans leave in batches, the thread wakes once per
full batch (never per span), a full queue drops and counts, flush and
shutdown post what is left. The posted bodies are decoded with the
OpenTelemetry proto package (`testing.fake_span_post`)."""

from __future__ import annotations

import threading
import time

from gateway.telemetry._export import SpanQueue
from gateway.telemetry._lean import LeanSpan
from testing.fake_span_post import FakeSpanPost as Posts


def ended(name: str, attributes: dict | None = None) -> LeanSpan:
    span = LeanSpan(None, name, 5, 0, 1, attributes or {}, 1)
    span.end_time = 2
    return span


def queue(posts: Posts, **kw) -> SpanQueue:
    return SpanQueue(posts, resource={"service.name": "gw"}, scope="evolving-infra.gateway", **kw)


def test_spans_wait_for_the_schedule_then_leave_in_one_body_per_batch() -> None:
    posts = Posts()
    q = queue(posts, batch=4, max_queue=16, delay_s=60)
    for i in range(3):
        q.put(ended(f"s{i}"))
    time.sleep(0.05)
    assert posts.bodies == [] and len(q) == 3  # under a batch: the thread sleeps on
    q.put(ended("s3"))  # a full batch wakes it
    assert posts.posted.wait(5)
    q.flush()
    assert posts.names() == ["s0", "s1", "s2", "s3"] and len(posts.bodies) == 1
    rs = posts.bodies[0].resource_spans[0]
    assert rs.resource.attributes[0].value.string_value == "gw"
    assert rs.scope_spans[0].scope.name == "evolving-infra.gateway"
    for i in range(10):
        q.put(ended(f"t{i}"))
    assert q.flush()
    assert [len(r.resource_spans[0].scope_spans[0].spans) for r in posts.bodies[1:]] == [4, 4, 2]
    q.shutdown()


def test_a_full_queue_drops_and_counts_and_a_failed_post_is_counted() -> None:
    posts = Posts(ok=False)
    q = queue(posts, batch=8, max_queue=8, delay_s=60)
    for i in range(11):
        q.put(ended(f"s{i}"))
    assert q.dropped == 3 and len(q) == 8
    assert q.flush() is False and q.failed_exports == 1
    assert len(posts.names()) == 8
    q.shutdown()


def test_a_span_the_encoder_cannot_write_is_dropped_not_raised() -> None:
    posts = Posts()
    q = queue(posts, batch=8, max_queue=8, delay_s=60)
    q.put(ended("bad", {"x": object()}))  # not an OTLP type: written as its str()
    q.put(ended("worse", {"x": 2**70}))  # an int past 64 bits cannot be
    q.put(ended("good"))
    q.flush()
    assert q.unencodable == 1 and posts.names() == ["bad", "good"]
    q.shutdown()


def test_a_requests_spans_queue_as_one_piece_that_no_body_splits() -> None:
    posts = Posts()
    q = queue(posts, batch=4, max_queue=12, delay_s=60)
    q.put_many([ended(f"a{i}") for i in range(3)])
    time.sleep(0.05)
    assert posts.bodies == [] and len(q) == 3  # under a batch: the thread sleeps on
    q.put_many([ended(f"b{i}") for i in range(3)])  # past a batch: it wakes, posts both pieces in one body
    assert posts.posted.wait(5)
    q.put_many([ended(f"c{i}") for i in range(3)])
    q.put_many([ended("d0")])  # a full batch again
    assert q.flush()
    assert [len(r.resource_spans[0].scope_spans[0].spans) for r in posts.bodies] == [6, 4]
    assert posts.names() == [*(f"a{i}" for i in range(3)), *(f"b{i}" for i in range(3)), "c0", "c1", "c2", "d0"]
    assert len(q) == 0
    q.put_many([ended("ok"), ended("worse", {"x": 2**70}), ended("fine")])  # one span OTLP cannot carry
    q.flush()
    assert q.unencodable == 1 and posts.names()[-2:] == ["ok", "fine"]
    q.shutdown()


def test_a_piece_that_does_not_fit_is_dropped_whole_and_counted() -> None:
    q = queue(Posts(), batch=8, max_queue=8, delay_s=60)
    q.put_many([ended(f"a{i}") for i in range(5)])
    q.put_many([ended(f"b{i}") for i in range(4)])  # 9 > 8 held at most
    q.put_many([ended(f"c{i}") for i in range(3)])
    assert q.dropped == 4 and len(q) == 8
    q.shutdown()


def test_shutdown_posts_what_is_left_closes_the_transport_and_refuses_more() -> None:
    posts = Posts()
    closed = []
    q = SpanQueue(posts, resource={}, scope="s", batch=8, delay_s=60, on_shutdown=lambda: closed.append(True))
    q.put(ended("last"))
    q.shutdown()
    assert posts.names() == ["last"] and closed == [True]
    q.put(ended("late"))
    assert q.dropped == 1 and len(q) == 0


def test_spans_that_come_while_a_slow_post_runs_wait_for_the_next_wake() -> None:
    """A slow collector does not turn the thread into a stream of small posts."""
    posts = Posts()
    release = threading.Event()
    calls: list[float] = []

    def slow(body: bytes) -> bool:
        calls.append(time.monotonic())
        if len(calls) == 1:
            release.wait(5)  # the first post is slow: spans keep coming meanwhile
        return posts(body)

    q = SpanQueue(slow, resource={"service.name": "gw"}, scope="s", batch=4, max_queue=64, delay_s=0.5)
    for i in range(4):
        q.put(ended(f"a{i}"))  # a full batch: the thread wakes and posts it
    deadline = time.monotonic() + 5
    while not calls and time.monotonic() < deadline:
        time.sleep(0.01)
    for i in range(2):
        q.put(ended(f"b{i}"))  # under a batch, while the post runs
    release.set()
    time.sleep(0.2)
    assert len(calls) == 1 and len(q) == 2  # not posted at once after the slow one
    deadline = time.monotonic() + 5
    while len(calls) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert posts.names() == ["a0", "a1", "a2", "a3", "b0", "b1"]
    assert calls[1] - calls[0] >= 0.4  # at the next wake (delay_s after the first)
    q.shutdown()
