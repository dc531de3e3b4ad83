"""The load's plan and its numbers, with literal inputs (no traces, no HTTP)."""

from __future__ import annotations

import random

import pytest

from cli import load_plan as plan
from cli.load_stats import PhaseStats, RequestResult


def words(n: int, tag: str = "w") -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


class WordCodec:
    """A fake codec: one word is one token."""

    def count(self, text: str) -> int:
        return len(text.split())

    def cut(self, text: str, head: int, total: int) -> tuple[str, str]:
        ids = plan.head_and_tail(text.split(), head, total)
        return " ".join(ids[:head]) + " ", " ".join(ids[head:])  # joined back, as a tokenizer's pieces


def test_head_and_tail_keeps_the_start_and_the_newest_part() -> None:
    assert plan.head_and_tail(list(range(10)), 2, 5) == [0, 1, 7, 8, 9]
    assert plan.head_and_tail(list(range(4)), 2, 5) == [0, 1, 2, 3]
    assert plan.head_and_tail(list(range(10)), 0, 3) == [7, 8, 9]


def test_char_codec_estimates_and_cuts() -> None:
    codec = plan.CharCodec(chars_per_token=2.0)
    assert codec.count("abcdef") == 3 and codec.count("abcdefg") == 4
    assert codec.cut("abcdef", 1, 3) == ("ab", "cdef")
    assert codec.cut("abcdefghij", 1, 3) == ("ab", "ghij")


def test_length_pdf_is_scaled_to_the_mean_and_clipped() -> None:
    pdf = plan.LengthPdf.of({100: 1.0, 300: 1.0})
    assert pdf.mean == 200.0
    rng = random.Random(0)
    draws = [pdf.sample_scaled(rng, 50.0, 10, 70) for _ in range(400)]
    assert set(draws) == {25, 70}  # 100 -> 25, 300 -> 75 clipped to 70
    with pytest.raises(ValueError, match="empty length distribution"):
        plan.LengthPdf.of({})


def _turns(session: str, n: int, prompt_words: int, gap: float = 5.0) -> list[plan.SourceTurn]:
    return [
        plan.SourceTurn(session, words(prompt_words * (i + 1), f"{session}-"), words(40), gap if i else 0.0)
        for i in range(n)
    ]


def test_prefill_sessions_cut_long_contexts_to_head_plus_newest_and_short_answers() -> None:
    cfg = plan.LoadConfig(prefill_prompt_tokens=200, prefill_head_tokens=20, prefill_output_max=8, max_gap_s=1.0)
    (s,) = plan.prefill_sessions(_turns("a", 3, 300), cfg, WordCodec())
    assert s.source == "a" and len(s.turns) == 3
    budget = 200 - plan.TEMPLATE_TOKENS
    for i, t in enumerate(s.turns):
        shared, own = t.shared.split(), t.own.split()
        assert shared == [f"a-{k}" for k in range(20)] and len(shared) + len(own) == budget
        assert own[-1] == f"a-{300 * (i + 1) - 1}"  # the newest part of that turn's context
        assert t.max_tokens == 8
    # Sent as: the shared head (cached across agents), the agent's branch, its own part.
    sent = s.turns[0].prompt("b1").split("\n")
    assert sent == [s.turns[0].shared, "[agent b1]", s.turns[0].own]
    assert [t.gap_s for t in s.turns] == [0.0, 1.0, 1.0] and [t.last for t in s.turns] == [False, False, True]


def test_decode_sessions_keep_the_conversation_and_draw_long_answers() -> None:
    cfg = plan.LoadConfig(
        decode_output_mean=300, decode_output_max=400, max_context_tokens=1024, prefill_prompt_tokens=512
    )
    pdf = plan.LengthPdf.of({1000: 1.0})
    a, b = plan.decode_sessions(_turns("a", 2, 30) + _turns("b", 1, 2000), cfg, WordCodec(), pdf)
    assert [t.own.strip() for t in a.turns] == [words(30, "a-"), words(60, "a-")]  # as in the trace
    assert {t.max_tokens for t in a.turns} == {300} and {t.shared for t in a.turns} == {""}
    assert a.turns[1].prompt("x").startswith("[agent x]\n")  # nothing shared across agents
    room = 1024 - 400 - plan.TEMPLATE_TOKENS
    assert len(b.turns[0].own.split()) == room and b.turns[0].last


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match=r"prefill_prompt_tokens \+ prefill_output_max must fit"):
        plan.LoadConfig(prefill_prompt_tokens=4000, prefill_output_max=200)
    with pytest.raises(ValueError, match="decode_output_max must leave 512 tokens"):
        plan.LoadConfig(max_context_tokens=1024, decode_output_max=600, prefill_prompt_tokens=512)
    with pytest.raises(ValueError, match="phases non-empty"):
        plan.LoadConfig(phases=())


def test_phase_sequence_and_deck() -> None:
    cfg = plan.LoadConfig(phases=(plan.PhaseKind.PREFILL_HEAVY, plan.PhaseKind.DECODE_HEAVY))
    assert [(n, k.value) for n, k in plan.phase_sequence(cfg, 2)] == [
        (1, "prefill"),
        (2, "decode"),
        (3, "prefill"),
        (4, "decode"),
    ]
    deck = plan.SessionDeck([plan.Session(str(i), ()) for i in range(3)], random.Random(1))
    first = [deck.next().source for _ in range(3)]
    assert sorted(first) == ["0", "1", "2"]  # each once per round
    assert sorted(deck.next().source for _ in range(3)) == ["0", "1", "2"]


def test_phase_stats_summary_and_lines() -> None:
    stats = PhaseStats(2, plan.PhaseKind.DECODE_HEAVY, agents=4)
    stats.add(RequestResult(True, 2.0, 0.1, prompt_tokens=100, cached_tokens=60, completion_tokens=20))
    stats.add(RequestResult(True, 4.0, 0.3, prompt_tokens=300, cached_tokens=200, completion_tokens=40))
    stats.add(RequestResult(False, 0.01, error="HTTP 429: slow down"))
    s = stats.summary(10.0)
    assert (s["requests"], s["errors"], s["prompt_tokens_mean"], s["output_tokens_mean"]) == (3, 1, 200.0, 30.0)
    assert s["cached_fraction"] == 0.65 and s["output_tokens_per_s"] == 6.0
    assert s["tpot_mean_s"] == pytest.approx(((2.0 - 0.1) / 19 + (4.0 - 0.3) / 39) / 2, abs=1e-4)
    line = stats.line(10.0)
    assert line.startswith("phase 2 decode-heavy: 10 s, 4 agents, 3 requests (1 errors)")
    assert "65% cached" in line and line.endswith("first error: HTTP 429: slow down")
    bar = stats.progress(5.0, 10.0, in_flight=3)
    assert "[############............]" in bar and "in flight 3" in bar


def test_requests_cut_short_by_the_stop_are_not_errors() -> None:
    stats = PhaseStats(1, plan.PhaseKind.PREFILL_HEAVY, agents=2)
    stats.add(RequestResult(True, 0.2, 0.1, prompt_tokens=10, completion_tokens=2))
    stats.add(RequestResult(False, 0.1, error="ConnectError: gone", interrupted=True))
    s = stats.summary(5.0)
    assert (s["errors"], s["interrupted"], s["first_error"]) == (0, 1, None)
    assert "(0 errors, 1 cut short by the stop)" in stats.line(5.0)
