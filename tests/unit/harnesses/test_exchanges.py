"""The harness suite's reading of recorded exchanges and its judgement (pure)."""

from __future__ import annotations

import json

from testing.harnesses.exchanges import read, sse_events
from testing.harnesses.recorder import Exchange
from testing.harnesses.scratch import TurnOutcome
from testing.harnesses.suite import judge, request_counts

SSE = {"content-type": "text/event-stream"}
JSON = {"content-type": "application/json"}


def _ex(path: str, body: dict, status: int, headers: dict, answer: bytes, branch: str | None = "b1") -> Exchange:
    h = {**headers, **({"x-branch-id": branch} if branch else {})}
    return Exchange("x/0", "POST", path, "", {}, json.dumps(body).encode(), status, h, answer)


def _sse(*events: dict) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def test_sse_events_reads_data_lines_and_refuses_a_broken_one():
    assert sse_events(b'event: a\ndata: {"x": 1}\n\ndata: [DONE]\n\n') == [{"x": 1}]
    assert sse_events(b'data: {"x": \n\n') is None


def test_chat_stream_usage_stop_and_branch():
    answer = _sse(
        {"choices": [{"delta": {"content": "hi"}, "finish_reason": None}]},
        {"choices": [{"delta": {}, "finish_reason": "stop"}]},
        {"choices": [], "usage": {"prompt_tokens": 2246, "prompt_tokens_details": {"cached_tokens": 2208}}},
    )
    r = read(_ex("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}, 200, SSE, answer))
    assert (r.api, r.parsed, r.streamed, r.branch) == ("chat", True, True, "b1")
    assert (r.prompt_tokens, r.cached_tokens, r.stop, r.tool_call, r.tool_result) == (2246, 2208, "stop", False, False)


def test_chat_tool_result_is_the_newest_message():
    body = {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": []},
                         {"role": "tool", "tool_call_id": "1", "content": "a b"}]}  # fmt: skip
    answer = json.dumps({"choices": [{"message": {"content": "2"}, "finish_reason": "stop"}]}).encode()
    r = read(_ex("/v1/chat/completions", body, 200, JSON, answer))
    assert (r.streamed, r.parsed, r.tool_result, r.stop) == (False, True, True, "stop")


def test_responses_stream_completed_with_a_function_call():
    answer = _sse(
        {"type": "response.created", "response": {"status": "in_progress", "output": []}},
        {"type": "response.completed", "response": {"status": "completed",
         "output": [{"type": "function_call", "name": "list_files"}],
         "usage": {"input_tokens": 900, "input_tokens_details": {"cached_tokens": 864}}}},
    )  # fmt: skip
    body = {"input": [{"type": "function_call_output", "call_id": "c", "output": "a"}], "previous_response_id": "r"}
    r = read(_ex("/v1/responses", body, 200, SSE, answer))
    assert (r.api, r.stop, r.tool_call, r.tool_result, r.cached_tokens, r.prompt_tokens) == (
        "responses", "completed", True, True, 864, 900)  # fmt: skip


def test_messages_stream_cache_read_and_tool_use():
    answer = _sse(
        {"type": "message_start", "message": {"usage": {"input_tokens": 10, "cache_read_input_tokens": 64}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "tool_use", "name": "list_files"}},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 9}},
    )
    body = {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "a"}]}]}
    r = read(_ex("/v1/messages", body, 200, SSE, answer))
    assert (r.prompt_tokens, r.cached_tokens, r.stop, r.tool_call, r.tool_result) == (74, 64, "tool_use", True, True)


def test_error_answer_and_other_paths():
    err = read(_ex("/v1/messages", {"messages": []}, 400, JSON, b'{"type":"error"}', branch=None))
    assert not err.ok and err.parsed and err.branch is None
    other = read(Exchange("x/0", "HEAD", "/", "", {}, b"", 200, {}, b""))
    assert other.api == "other" and other.ok and other.parsed


METRICS = """# HELP evolving_requests_total OpenAI API requests
# TYPE evolving_requests_total counter
evolving_requests_total{endpoint="chat",status="200",tenant="t1"} 5.0
evolving_requests_total{endpoint="messages",status="400",tenant="t1"} 2.0
evolving_requests_total{endpoint="other",status="404",tenant="-"} 1.0
evolving_requests_total{endpoint="chat",status="200",tenant="t2"} 7.0
# HELP evolving_requests_created OpenAI API requests
# TYPE evolving_requests_created gauge
evolving_requests_created{endpoint="chat",status="200",tenant="t1"} 1.7963e+09
"""


def test_request_counts_take_the_tenant_and_the_unauthenticated():
    assert request_counts(METRICS, "t1") == (8, 3)


def _turn(n: int, cached: int, branch: str = "b1", status: int = 200, tool_result: bool = False) -> tuple:
    messages = [{"role": "user", "content": "x"}] + ([{"role": "tool", "content": "a"}] if tool_result else [])
    usage = {"prompt_tokens": 99, "prompt_tokens_details": {"cached_tokens": cached}}
    answer = json.dumps({"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}], "usage": usage})
    return n, _ex("/v1/chat/completions", {"messages": messages}, status, JSON, answer.encode(), branch)


def test_judge_passes_one_branch_with_growing_cache_and_a_round_trip():
    report = judge(True, [TurnOutcome(0, "4 files"), TurnOutcome(0, "notes.txt")],
                   [_turn(0, 0), _turn(0, 32, tool_result=True), _turn(1, 96)], (3, 0))  # fmt: skip
    assert report.ok, report.failures
    assert report.summary() == {"requests": 3, "non_2xx": 0, "exit_code": 0, "tool_round_trips": 1, "branches": 1,
                                "cached_tokens_last": 96}  # fmt: skip
    assert report.cached_by_turn == [32, 96]


def test_judge_names_each_failure():
    report = judge(True, [TurnOutcome(1, ""), TurnOutcome(0, "")],
                   [_turn(0, 64), _turn(1, 0, branch="b2"), _turn(1, 0, status=400)], (3, 1))  # fmt: skip
    assert report.failures == [
        "turn 0: exit code 1",
        "1 non-2xx answers (1 in the gateway's counters)",
        "2 branches for 1 harness session(s)",
        "cached tokens did not grow across turns: [64, 0]",
        "no tool round trip",
    ]


def _length(n: int) -> tuple[int, Exchange]:
    return n, _ex("/v1/chat/completions", {"messages": []}, 200, JSON,
                  b'{"choices": [{"message": {}, "finish_reason": "length"}]}')  # fmt: skip


def test_judge_never_excuses_a_timeout_as_a_length_stop():
    assert judge(False, [TurnOutcome(1, "")], [_length(0)], (1, 0)).failures == []
    assert judge(False, [TurnOutcome(124, "")], [_length(0)], (1, 0)).failures == ["turn 0: exit code 124"]


def test_judge_excuses_a_turn_by_its_own_last_stop():
    # Turn 0 gave up on its length stop and turn 1 finished: named, not a failure.
    report = judge(False, [TurnOutcome(1, ""), TurnOutcome(0, "")], [_length(0), _turn(1, 96)], (2, 0))
    assert report.failures == [] and report.length_stopped_turns == [0] and report.exit_code == 1
    # Turn 1 failed after a plain stop: turn 0's length stop does not excuse it.
    report = judge(False, [TurnOutcome(0, ""), TurnOutcome(1, "")], [_length(0), _turn(1, 96)], (2, 0))
    assert report.failures == ["turn 1: exit code 1"] and report.length_stopped_turns == []


def test_a_new_session_after_a_length_stop_counts_as_one():
    # The Agents SDK raised on turn 0's length stop and could not chain turn 1 to it:
    # two sessions, two branches, no cached-token growth to expect across them.
    new = TurnOutcome(0, "", continues_session=False)
    report = judge(False, [TurnOutcome(1, ""), new], [_length(0), _turn(1, 0, branch="b2")], (2, 0))
    assert report.sessions == 2 and report.branches == 2 and report.failures == []
    # ... but a new session after a turn that finished normally is a failure, as is one branch too many.
    report = judge(False, [TurnOutcome(0, ""), new], [_turn(0, 64), _turn(1, 0, branch="b2")], (2, 0))
    assert report.failures == ["turn 1 opened a new session after a turn that did not stop on the length limit"]
    report = judge(
        False, [TurnOutcome(1, ""), new], [_length(0), _turn(1, 0, branch="b2"), _turn(1, 0, branch="b3")], (3, 0)
    )
    assert report.failures == ["3 branches for 2 harness session(s)"]
