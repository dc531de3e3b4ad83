"""The output budget and the choices' seeds (gateway.serving.turn.spec)."""

from __future__ import annotations

import pytest

from gateway.http.errors import InvalidRequest
from gateway.serving.turn.spec import SEED_MAX, choice_seeds, replay_needs_seed, resolve_max_tokens


@pytest.mark.parametrize(
    ("prompt", "requested", "limit", "cap", "want"),
    [
        (100, None, 4096, None, 3996),  # unset: what the context leaves
        (100, None, 4096, 512, 512),  # an operator's cap bounds the default
        (4000, None, 4096, 512, 96),  # ... but never beyond the context
        (100, 50, 4096, None, 50),
        (100, 3996, 4096, None, 3996),  # exactly fits
        (100, None, None, None, 1024),  # limit unknown: the fallback
        (100, 7, None, None, 7),
    ],
)
def test_budget(prompt: int, requested: int | None, limit: int | None, cap: int | None, want: int) -> None:
    assert resolve_max_tokens(prompt, requested, limit, cap=cap) == want


def test_an_oversized_request_quotes_only_what_the_client_sent() -> None:
    with pytest.raises(InvalidRequest) as err:
        resolve_max_tokens(100, 4000, 4096, param="max_completion_tokens")
    assert err.value.param == "max_completion_tokens" and err.value.code == "context_length_exceeded"
    assert "4100 tokens (100 in the messages, 4000 in `max_completion_tokens`)" in err.value.message
    with pytest.raises(InvalidRequest) as err:
        resolve_max_tokens(5000, None, 4096)
    assert err.value.param == "messages" and "max_tokens" not in err.value.message  # the client sent none


def test_seeds_follow_vllms_seed_plus_index() -> None:
    assert choice_seeds(10, 3, needs_seed=False, draw=0) == [10, 11, 12]
    assert choice_seeds(None, 2, needs_seed=False, draw=99) == [None, None]
    assert choice_seeds(None, 2, needs_seed=True, draw=99) == [99, 100]
    assert choice_seeds(SEED_MAX, 2, needs_seed=False, draw=0) == [SEED_MAX, 0]  # wraps within int64
    with pytest.raises(ValueError, match="n must be >= 1"):
        choice_seeds(None, 0, needs_seed=False, draw=0)


def test_only_sampled_replays_need_a_seed() -> None:
    assert replay_needs_seed(0.7, resumable=False)
    assert not replay_needs_seed(0.0, resumable=False)  # greedy replays identically anyway
    assert not replay_needs_seed(0.7, resumable=True)


def test_model_defaults_fill_only_what_the_client_left_out() -> None:
    from gateway.serving.turn.spec import Sampling, unset_fields, with_defaults

    class Req:
        temperature = None
        top_p = 0.5
        top_k = None

    unset = unset_fields(Req())
    assert unset == {"temperature", "top_k", "min_p", "repetition_penalty"}
    out = with_defaults(Sampling(top_p=0.5), unset, {"temperature": 0.2, "top_p": 0.9})
    assert (out.temperature, out.top_p, out.top_k) == (0.2, 0.5, 0)
    assert with_defaults(Sampling(), frozenset(), {"temperature": 0.2}) == Sampling()
