"""The chaos bench's token comparison: near ties apart from faults."""

from __future__ import annotations

import math

from bench._chaos_load import Diff, Outcome, Tok, compare, compare_tokens, score, tie_gap


def tok(token: str, alt: str = "~", gap: float = 5.0) -> Tok:
    """A greedy token with logprob -0.5 and one runner-up `gap` nats below."""
    return Tok(token, -0.5, {token: -0.5, alt: -0.5 - gap})


def toks(text: str) -> list[Tok]:
    return [tok(c) for c in text]


def test_identical_streams_differ_nowhere() -> None:
    assert compare_tokens(toks("abcd"), toks("abcd")) == Diff()


def test_a_resent_token_counts_as_duplicated() -> None:
    # a resume that sends "c" twice: the repeat is no runner-up of position 3
    d = compare_tokens(toks("abcdef"), toks("abccdef"))
    assert (d.duplicated, d.missing, d.mismatched, d.tie_at, d.first_diff) == (1, 0, 0, None, 3)


def test_a_dropped_token_counts_as_missing() -> None:
    d = compare_tokens(toks("abcdef"), toks("abdef"))
    assert (d.duplicated, d.missing, d.mismatched) == (0, 1, 0)


def test_a_near_tie_flip_is_no_fault_and_what_follows_is_not_counted() -> None:
    ref = [tok("a"), tok("3", alt="4", gap=0.004), tok("x"), tok("y")]
    got = [tok("a"), tok("4", alt="3", gap=0.001), tok("z"), tok("z"), tok("z")]
    d = compare_tokens(ref, got)
    assert d == Diff(tie_at=1, tie_gap=0.004, first_diff=1)
    assert not d.counted


def test_a_flip_past_the_tie_margin_is_counted() -> None:
    ref = [tok("a"), tok("3", alt="4", gap=0.5), tok("x")]
    got = [tok("a"), tok("4", alt="3", gap=0.5), tok("x")]
    d = compare_tokens(ref, got)
    assert d.tie_at is None and d.mismatched == 1


def test_a_tie_needs_both_runs_to_list_the_other_token() -> None:
    ref = [tok("3", alt="4", gap=0.001)]
    got = [tok("4", alt="9", gap=0.001)]  # the reference's "3" is not among its alternatives
    assert tie_gap(ref[0], got[0]) is None
    assert compare_tokens(ref, got).mismatched == 1


def test_tie_gap_is_the_larger_of_the_two_runs() -> None:
    ref, got = tok("3", alt="4", gap=0.001), tok("4", alt="3", gap=0.01)
    gap = tie_gap(ref, got)
    assert gap is not None and math.isclose(gap, 0.01)


def test_a_stream_cut_short_counts_its_missing_tail() -> None:
    d = compare_tokens(toks("abcd"), toks("ab"))
    assert (d.missing, d.tie_at, d.first_diff) == (2, None, 2)


class _Tokenizer:
    def encode_text(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]


def test_text_only_streams_fall_back_to_reencoded_ids() -> None:
    d = compare(_Tokenizer(), Outcome("completed", text="abc"), Outcome("completed", text="abbc"))
    assert d.duplicated == 1


def _done(tokens: list[Tok], completion: int) -> Outcome:
    usage = {"prompt_tokens": 10, "completion_tokens": completion}
    return Outcome("completed", text="".join(t.token for t in tokens), tokens=tokens, finish="stop", usage=usage)


def test_score_keeps_ties_apart_and_excuses_their_length() -> None:
    ref = {("a", 0): _done(toks("abc"), 3), ("b", 0): _done(toks("abc"), 3)}
    tie_ref = [tok("a"), tok("3", alt="4", gap=0.001)]
    ref[("c", 0)] = _done(tie_ref, 2)
    got = {
        ("a", 0): _done(toks("abc"), 3),
        ("b", 0): _done(toks("abbc"), 4),  # a duplicated token
        ("c", 0): _done([tok("a"), tok("4", alt="3", gap=0.001), tok("z")], 3),  # a near tie, longer
    }
    s = score(_Tokenizer(), ref, got)
    assert (s["duplicated_tokens"], s["mismatched_requests"], s["tie_flips"], s["usage_mismatch"]) == (1, 1, 1, 1)
    assert s["tie_flip_gaps"] == [0.001]
    assert s["mismatch_detail"][0].startswith("b#0 @")
