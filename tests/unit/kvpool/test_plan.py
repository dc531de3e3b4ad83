"""`step_shape`: what one engine step computes, from a fake of vLLM's SchedulerOutput."""

from __future__ import annotations

from types import SimpleNamespace

from kvpool.plan import step_shape


def _fake_scheduler_output() -> SimpleNamespace:
    """Fake with the fields step_shape reads: a new prompt (300 scheduled over
    200 cached), a prompt's second chunk (100 over 512 computed), a decode
    (1 token over 40 computed)."""
    new = [SimpleNamespace(req_id="a", num_computed_tokens=200)]
    cached = SimpleNamespace(req_ids=["b", "c"], num_output_tokens=[0, 3], num_computed_tokens=[512, 40])
    return SimpleNamespace(
        scheduled_new_reqs=new, scheduled_cached_reqs=cached, num_scheduled_tokens={"a": 300, "b": 100, "c": 1}
    )


def test_step_shape_sums_prefills_and_decodes_and_per_prompt_attention_pairs() -> None:
    assert step_shape(_fake_scheduler_output()) == {
        "prefill_requests": 2,
        "uncached_prompt_tokens": 400,
        "cached_prompt_tokens": 200,
        "attention_pairs": 300 * (300 + 200) + 100 * (100 + 512),
        "decode_requests": 1,
        "generated_tokens": 1,
        "context_tokens": 41,
    }
