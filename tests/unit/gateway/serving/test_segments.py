"""gateway.serving.segments: one request's progress across worker segments, in literal scenarios."""

from __future__ import annotations

import pytest

from core import FinishReason, Phase, Role
from gateway.http.errors import UpstreamFailed
from gateway.serving.segments import Next, RequestProgress, SegmentOutcome, segment_outcome


def _progress(max_tokens: int = 4, max_node_failures: int = 2, max_migrations: int = 1) -> RequestProgress:
    return RequestProgress("r", [1, 2, 3], max_tokens, max_node_failures, max_migrations)


def _absorb(
    p: RequestProgress,
    tokens: list[int],
    *,
    cached: int = 0,
    finish: FinishReason | None = None,
    role: Role = Role.DECODE,
    at: float = 0.0,
) -> list[int]:
    return p.absorb(tokens, cached_tokens=cached, finish=finish, role=role, elapsed_s=at)[1]


@pytest.mark.parametrize(
    ("reason", "outcome"),
    [
        (None, None),
        (FinishReason.STOP, SegmentOutcome.FINISHED),
        (FinishReason.LENGTH, SegmentOutcome.FINISHED),
        (FinishReason.ABORT, SegmentOutcome.GAVE_UP),
        (FinishReason.MIGRATED, SegmentOutcome.GAVE_UP),
    ],
)
def test_segment_outcome(reason: FinishReason | None, outcome: SegmentOutcome | None) -> None:
    assert segment_outcome(reason) is outcome


def test_an_error_finish_is_not_a_segment_outcome() -> None:
    with pytest.raises(ValueError, match="is not a segment outcome"):
        segment_outcome(FinishReason.ERROR)


def test_next_call_numbers_segments_and_asks_prefill_for_one_token() -> None:
    p = _progress()
    assert p.next_call(Role.PREFILL) == ("r.1", 1)
    assert p.next_call(Role.DECODE) == ("r.1", 4)
    p.started("n0")
    assert _absorb(p, [10, 11, 12]) == [10, 11, 12]
    assert p.next_call(Role.DECODE) == ("r.2", 1)
    assert p.context() == [1, 2, 3, 10, 11, 12]
    assert (p.first_segment, p.nodes) == (False, ["n0"])


def test_budget_spent_ends_the_request_with_length() -> None:
    p = _progress(max_tokens=2)
    p.finish = FinishReason.STOP
    assert p.budget_spent() is False
    assert p.finish is FinishReason.STOP
    _absorb(p, [10, 11])
    assert p.budget_spent() is True
    assert _finish(p) is FinishReason.LENGTH


def _finish(p: RequestProgress) -> FinishReason:
    """Read through a call: after `p.finish is STOP` mypy would take it for STOP still."""
    return p.finish


def test_absorb_cuts_tokens_to_the_budget() -> None:
    p = _progress(max_tokens=4)
    assert _absorb(p, [10, 11, 12, 13, 14, 15]) == [10, 11, 12, 13]
    assert _absorb(p, [16]) == []
    assert (p.generated, p.remaining) == ([10, 11, 12, 13], 0)


def test_first_tokens_set_ttft_and_first_phase_once() -> None:
    p = _progress()
    _absorb(p, [], role=Role.PREFILL, at=0.1)
    assert (p.ttft_s, p.first_phase) == (0.0, None)
    _absorb(p, [10], role=Role.PREFILL, at=0.5)
    _absorb(p, [11], role=Role.DECODE, at=0.9)
    assert (p.ttft_s, p.first_phase) == (0.5, Phase.PREFILL)


def test_cached_is_set_by_the_first_chunk_with_tokens() -> None:
    p = _progress()
    _absorb(p, [], cached=7)
    _absorb(p, [], cached=7, finish=FinishReason.MIGRATED)  # a segment given up says nothing yet
    assert p.cached is None
    _absorb(p, [10], cached=3)
    _absorb(p, [11], cached=9)
    assert p.cached == 3


def test_cached_is_set_by_an_ending_finish_without_tokens() -> None:
    p = _progress()
    _absorb(p, [], cached=5, finish=FinishReason.STOP)
    assert p.cached == 5


@pytest.mark.parametrize(
    ("reason", "role", "next_", "just_prefilled"),
    [
        (FinishReason.STOP, Role.PREFILL, Next.DONE, False),
        (FinishReason.STOP, Role.DECODE, Next.DONE, False),
        (FinishReason.LENGTH, Role.PREFILL, Next.DECODE, True),  # the prefill's one token
        (FinishReason.LENGTH, Role.DECODE, Next.DONE, False),
    ],
)
def test_finished_segment(reason: FinishReason, role: Role, next_: Next, just_prefilled: bool) -> None:
    p = _progress()
    assert p.end_segment(SegmentOutcome.FINISHED, role, reason=reason) is next_
    assert (p.finish, p.just_prefilled, p.resumes) == (reason, just_prefilled, 0)


def test_gave_up_routes_again_until_too_many_migrations() -> None:
    p = _progress(max_migrations=1)
    p.just_prefilled = True
    assert p.end_segment(SegmentOutcome.GAVE_UP, Role.DECODE, reason=FinishReason.MIGRATED) is Next.ROUTE_AGAIN
    assert (p.migrations, p.resumes, p.just_prefilled, p.failures) == (1, 1, False, 0)
    with pytest.raises(UpstreamFailed) as exc:
        p.end_segment(SegmentOutcome.GAVE_UP, Role.DECODE, reason=FinishReason.ABORT)
    assert (exc.value.code, exc.value.status) == ("too_many_migrations", 502)
    assert exc.value.message == "request r migrated too often"
    assert (p.migrations, p.resumes) == (2, 2)


def test_failed_nodes_are_excluded_until_max_node_failures() -> None:
    p = _progress(max_node_failures=2)
    p.just_prefilled = True
    _absorb(p, [10])
    assert p.end_segment(SegmentOutcome.NODE_FAILED, Role.DECODE, node_id="n1", error="reset") is Next.ROUTE_AGAIN
    assert (p.excluded, p.failures, p.resumes, p.just_prefilled, p.migrations) == ({"n1"}, 1, 1, True, 0)
    with pytest.raises(UpstreamFailed) as exc:
        p.end_segment(SegmentOutcome.NODE_FAILED, Role.DECODE, node_id="n2", error="boom")
    assert exc.value.body()["error"]["code"] == "workers_failed"
    assert exc.value.message == "request r failed on 2 workers after 1 tokens; last error: boom"
    assert (p.excluded, p.failures, p.resumes) == ({"n1", "n2"}, 2, 2)


def test_a_refusal_skips_the_node_without_counting_a_failure() -> None:
    p = _progress(max_node_failures=1)
    p.just_prefilled = True
    assert p.end_segment(SegmentOutcome.REFUSED, Role.DECODE, node_id="n1", error="wrong_phase") is Next.ROUTE_AGAIN
    assert (p.refused, p.excluded, p.failures, p.refusals, p.just_prefilled) == ({"n1"}, set(), 0, 1, True)
    assert p.skip({"n1", "n2"}) == {"n1"}


def test_nodes_that_all_refused_are_asked_again_failed_ones_never() -> None:
    p = _progress(max_node_failures=3)
    p.end_segment(SegmentOutcome.NODE_FAILED, Role.DECODE, node_id="n0", error="reset")
    p.end_segment(SegmentOutcome.REFUSED, Role.DECODE, node_id="n1", error="wrong_phase")
    p.end_segment(SegmentOutcome.REFUSED, Role.DECODE, node_id="n2", error="wrong_phase")
    assert p.skip({"n0", "n1", "n2", "n3"}) == {"n0", "n1", "n2"} and p.refusal_rounds == 0
    # n3 left the cluster: every candidate had refused, so they are asked again
    assert p.skip({"n0", "n1", "n2"}) == {"n0"}
    assert (p.refused, p.refusal_rounds) == (set(), 1)


def test_too_many_refusals_end_the_request_with_a_typed_error() -> None:
    p = RequestProgress("r", [1, 2, 3], 4, max_node_failures=2, max_migrations=1, max_refusals=2)
    for _ in range(2):
        p.end_segment(SegmentOutcome.REFUSED, Role.DECODE, node_id="n1", error="wrong_phase")
    with pytest.raises(UpstreamFailed) as exc:
        p.end_segment(SegmentOutcome.REFUSED, Role.DECODE, node_id="n1", error="node is prefill")
    assert exc.value.body()["error"]["code"] == "workers_refused"
    assert exc.value.message == ("request r was turned down 3 times by workers changing phase; last: node is prefill")


# -- replay (a constrained or penalised request) ------------------------------------
def _replay(max_tokens: int = 5) -> RequestProgress:
    return RequestProgress("r", [1, 2, 3], max_tokens, max_node_failures=3, max_migrations=3, replay=True)


def test_a_replayed_continuation_reruns_the_prompt_with_the_full_budget() -> None:
    p = _replay()
    assert p.next_call(Role.PREFILL) == ("r.1", 1)
    p.started("a")
    assert _absorb(p, [10], role=Role.PREFILL) == [10]
    assert p.end_segment(SegmentOutcome.FINISHED, Role.PREFILL, reason=FinishReason.LENGTH) is Next.DECODE
    # the decode node gets the original prompt and the whole budget, not prompt + [10]
    assert p.context() == [1, 2, 3] and p.carried == 0 and p.next_call(Role.DECODE) == ("r.2", 5)
    p.started("b")
    # it regenerates 10 (dropped, already sent), then continues
    assert p.absorb([10, 11], cached_tokens=0, finish=None, role=Role.DECODE, elapsed_s=1.0) == (1, [11])
    assert p.absorb([12], cached_tokens=0, finish=None, role=Role.DECODE, elapsed_s=1.1) == (0, [12])
    assert p.generated == [10, 11, 12]


def test_a_replay_after_a_migration_skips_across_chunks() -> None:
    p = _replay(max_tokens=6)
    p.started("a")
    _absorb(p, [10, 11, 12])
    assert p.end_segment(SegmentOutcome.GAVE_UP, Role.DECODE, reason=FinishReason.MIGRATED) is Next.ROUTE_AGAIN
    p.started("b")
    assert p.absorb([10], cached_tokens=0, finish=None, role=Role.DECODE, elapsed_s=2.0) == (1, [])
    assert p.absorb([11, 12, 13, 14], cached_tokens=0, finish=None, role=Role.DECODE, elapsed_s=2.1) == (2, [13, 14])
    assert p.generated == [10, 11, 12, 13, 14] and p.remaining == 1


def test_a_replay_that_diverges_is_an_error_not_different_output() -> None:
    p = _replay()
    p.started("a")
    _absorb(p, [10, 11])
    p.end_segment(SegmentOutcome.NODE_FAILED, Role.DECODE, node_id="a")
    p.started("b")
    with pytest.raises(UpstreamFailed) as err:
        p.absorb([10, 99], cached_tokens=0, finish=None, role=Role.DECODE, elapsed_s=1.0)
    assert err.value.code == "resume_mismatch"
    assert p.generated == [10, 11]  # nothing of the diverging replay reached the client
