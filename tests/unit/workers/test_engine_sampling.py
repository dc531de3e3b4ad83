"""The worker's sampling surface without an engine: SamplingOptions as vLLM's
SamplingParams, vLLM's per-token logprob dicts as wire entries, and the
whitespace bound put on tool-call JSON inside a structural tag."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from core import Role
from workers.engine import EngineConfig, WorkerEngine
from workers.protocol import GenerateRequest, SamplingOptions, StructuredOutput
from workers.vllm_fields import bound_tag_whitespace, token_logprobs


def _engine(**config) -> WorkerEngine:
    return WorkerEngine(EngineConfig(model="unused", kv_pool=False, **config), phase_of=lambda: None)


def _request(role: Role = Role.DECODE, **sampling) -> GenerateRequest:
    return GenerateRequest(request_id="r1", prompt_token_ids=[1, 2, 3], role=role, sampling=SamplingOptions(**sampling))


def test_every_sampling_option_reaches_vllm() -> None:
    params = _engine()._sampling_params(
        _request(
            max_tokens=9,
            temperature=0.7,
            top_p=0.9,
            top_k=5,
            min_p=0.1,
            seed=3,
            stop=["END"],
            stop_token_ids=[7],
            ignore_eos=True,
            min_tokens=2,
            presence_penalty=0.5,
            frequency_penalty=-0.5,
            repetition_penalty=1.2,
            logit_bias={4: -100.0},
            logprobs=2,
            structured_output=StructuredOutput(json_object=True),
        )
    )
    assert (params.max_tokens, params.temperature, params.top_p, params.top_k, params.min_p) == (9, 0.7, 0.9, 5, 0.1)
    assert (params.seed, params.stop, params.stop_token_ids, params.ignore_eos) == (3, ["END"], [7], True)
    assert (params.min_tokens, params.presence_penalty, params.frequency_penalty) == (2, 0.5, -0.5)
    assert (params.repetition_penalty, params.logit_bias, params.logprobs) == (1.2, {4: -100.0}, 2)
    assert params.structured_outputs is not None and params.structured_outputs.json_object is True


def test_a_prefill_call_computes_one_token() -> None:
    params = _engine()._sampling_params(_request(Role.PREFILL, max_tokens=50, min_tokens=10))
    assert params.max_tokens == 1 and params.min_tokens == 1


def test_compact_json_bounds_the_whitespace_of_tool_call_tags() -> None:
    tag = json.dumps(
        {
            "type": "structural_tag",
            "format": {
                "type": "triggered_tags",
                "tags": [{"begin": "<tool_call>", "content": {"type": "json_schema", "json_schema": {}}, "end": "x"}],
            },
        }
    )
    params = _engine(json_no_whitespace=True)._sampling_params(
        _request(structured_output=StructuredOutput(structural_tag=tag))
    )
    content = json.loads(params.structured_outputs.structural_tag)["format"]["tags"][0]["content"]
    assert content["max_whitespace_cnt"] == 1
    assert json.loads(bound_tag_whitespace(tag, limit=3))["format"]["tags"][0]["content"]["max_whitespace_cnt"] == 3
    # without the setting the tag goes to vLLM as the gateway built it
    plain = _engine()._sampling_params(_request(structured_output=StructuredOutput(structural_tag=tag)))
    assert plain.structured_outputs.structural_tag == tag


def test_token_logprobs_list_exactly_k_alternatives_and_the_sampled_token() -> None:
    from vllm.logprobs import Logprob

    positions = [
        # the sampled token (5) is outside the top 2: vLLM adds it with its own rank
        {9: Logprob(-0.1, rank=1), 8: Logprob(-1.0, rank=2), 5: Logprob(-4.0, rank=7)},
        # the sampled token is the most likely one
        {6: Logprob(-0.2, rank=1), 3: Logprob(-2.0, rank=2)},
        # ruled out by a constraint: -inf is not JSON
        {4: Logprob(float("-inf"), rank=3), 1: Logprob(-0.01, rank=1), 2: Logprob(-5.0, rank=2)},
    ]
    entries = token_logprobs([5, 6, 4], positions, 2)
    assert [e.token_id for e in entries] == [5, 6, 4]
    assert [e.logprob for e in entries] == [-4.0, -0.2, -9999.0]
    assert [e.top for e in entries] == [[(9, -0.1), (8, -1.0)], [(6, -0.2), (3, -2.0)], [(1, -0.01), (2, -5.0)]]
    assert [e.top for e in token_logprobs([5], positions[:1], 0)] == [[]]  # logprobs without alternatives


@pytest.mark.parametrize(
    "sampling",
    [
        {"presence_penalty": 2.5},
        {"frequency_penalty": -3},
        {"repetition_penalty": 0},
        {"logit_bias": {1: 101}},
        {"logprobs": 21},
        {"top_k": -2},
        {"min_p": 1.5},
        {"structured_output": {}},
        {"structured_output": {"json_object": True, "regex": "a"}},
    ],
)
def test_the_protocol_bounds_sampling_as_openai_does(sampling: dict) -> None:
    with pytest.raises(ValidationError):
        SamplingOptions(**sampling)
