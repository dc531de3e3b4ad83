"""The harness suite's reading of the gateway's request records (GET /admin/requests)."""

from testing.harnesses.suite import RecordView, record_view


def _rec(
    start: float,
    status: int = 200,
    tenant: str | None = "t1",
    branch: str | None = "b1",
    cached: int = 0,
    endpoint: str = "messages",
):
    return {
        "start": start,
        "status": status,
        "tenant": tenant,
        "branch_id": branch,
        "cached_tokens": cached,
        "endpoint": endpoint,
    }


def test_only_this_runs_tenant_and_time_in_start_order():
    records = [
        _rec(30.0, cached=64),  # newest first, as the route answers
        _rec(20.0, cached=32),
        _rec(25.0, tenant="other", branch="b9"),
        _rec(5.0, branch="old"),  # before the run
    ]
    assert record_view(records, "t1", since=10.0) == RecordView(requests=2, non_2xx=0, branches=1, cached_last=64)


def test_refusals_count_and_name_no_branch():
    records = [_rec(12.0, status=401, tenant=None, branch=None), _rec(11.0, status=200, branch="b1", cached=16)]
    assert record_view(records, "t1", since=10.0) == RecordView(requests=2, non_2xx=1, branches=1, cached_last=16)


def test_two_branches_and_nothing_served():
    assert record_view([_rec(11.0, branch="a"), _rec(12.0, branch="b")], "t1", 10.0).branches == 2
    assert record_view([_rec(11.0, status=500)], "t1", 10.0) == RecordView(1, 1, 0, None)


def test_token_counts_and_model_lists_are_not_generations():
    records = [
        _rec(13.0, endpoint="count_tokens", branch=None),
        _rec(12.0, endpoint="models", branch=None),
        _rec(11.0, endpoint="messages", cached=8),
    ]
    assert record_view(records, "t1", since=10.0) == RecordView(requests=1, non_2xx=0, branches=1, cached_last=8)
