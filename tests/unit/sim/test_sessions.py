"""Turns of a session: same start time = concurrent waves, joins, gaps; text prefix hashes."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim import traces
from sim.sessions import sessionize, text_block_hashes
from sim.workloads import NOMINAL_S_PER_OUTPUT_TOKEN as NOM

T = Path(__file__).resolve().parents[4] / "shared" / "traces"


def test_parallel_calls_of_a_session_stay_concurrent_and_the_next_turn_joins_them() -> None:
    raw = [
        (0.0, "s", 100, 50, ()),  # 0: first turn
        (5.0, "s", 200, 10, ()),  # 1, 2: two tool calls sent together
        (5.0, "s", 210, 30, ()),
        (9.0, "s", 300, 5, ()),  # 3: after both
        (1.0, None, 40, 4, ()),  # no session: open loop
    ]
    wl = sessionize(raw, "t", True, 512)
    by_t = {(r.arrival_s, r.prompt_tokens): r for r in wl.requests}
    first, a, b, join = by_t[(0.0, 100)], by_t[(5.0, 200)], by_t[(5.0, 210)], by_t[(9.0, 300)]
    assert a.after == b.after == (first.req_id,)  # siblings: neither waits for the other
    assert a.gap_s == b.gap_s == pytest.approx(5.0 - 50 * NOM)
    assert join.after == (a.req_id, b.req_id) and join.gap_s == pytest.approx(9.0 - (5.0 + 30 * NOM))
    assert by_t[(1.0, 40)].after == () and by_t[(1.0, 40)].session_id == f"r{by_t[(1.0, 40)].req_id}"
    assert [r.last_in_branch for r in (first, a, b, join)] == [False, False, False, True]


def test_gap_is_never_negative_and_open_loop_has_no_dependencies() -> None:
    wl = sessionize([(0.0, "s", 10, 1000, ()), (1.0, "s", 20, 5, ())], "t", True, 512)
    assert wl.requests[1].after == (0,) and wl.requests[1].gap_s == 0.0
    assert all(
        not r.after for r in sessionize([(0.0, "s", 10, 5, ()), (1.0, "s", 20, 5, ())], "t", False, 512).requests
    )


def test_text_block_hashes_are_chained_over_2048_characters_with_the_partial_block() -> None:
    a = text_block_hashes("x" * 4096 + "tail")
    b = text_block_hashes("x" * 4096 + "other tail, longer")
    c = text_block_hashes("y" + "x" * 4095 + "tail")
    assert len(a) == 3 and a[:2] == b[:2] and a[2] != b[2]
    assert a[1] != c[1] and a[0] != a[1]  # block 1 has the same text as block 0 but another prefix
    assert all(0 <= h < 2**63 for h in a) and text_block_hashes("") == ()


@pytest.mark.skipif(not T.exists(), reason="../shared/traces not present")
def test_raw_agent_text_gets_the_converted_files_prefix_structure() -> None:
    raw = traces.load_any(T / "agents" / "opencode")
    conv = traces.load_any(T / "agents" / "mooncake_style" / "opencode.jsonl")

    def shape(wl):
        ids: dict[int, int] = {}
        return [
            (r.prompt_tokens, r.output_tokens, r.after, tuple(ids.setdefault(h, len(ids)) for h in r.block_hashes))
            for r in wl.requests
        ]

    assert shape(raw) == shape(conv)
    assert sum(len(r.block_hashes) for r in raw.requests) > 500  # hashes exist: prefix caching applies
