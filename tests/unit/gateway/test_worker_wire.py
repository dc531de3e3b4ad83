"""The worker protocol's bytes: request bodies validate back to the request,
chunk lines decode and merge as the worker sent them."""

from __future__ import annotations

import json

import pytest

from core import FinishReason, Role
from gateway.upstream.wire import BadChunk, coalesce, decode_chunks, encode_generate
from workers.protocol import BlockLocation, GenerateChunk, GenerateRequest, KVTransferSpec, SamplingOptions


def full_request() -> GenerateRequest:
    """Every field set to a non-default value."""
    return GenerateRequest(
        request_id="chatcmpl-1.2",
        prompt_token_ids=[5, 6, 7, 2**40],
        sampling=SamplingOptions(
            max_tokens=9,
            temperature=0.5,
            top_p=0.9,
            seed=3,
            stop=["\n\n", "é"],
            stop_token_ids=[4],
            ignore_eos=True,
        ),
        role=Role.PREFILL,
        stream=False,
        tenant_salt="t|m",
        branch_id="ten/b-1",
        kv=KVTransferSpec(
            load=[BlockLocation(block_hash="ab" * 16, node_id="w1", slot=7)],
            peers={"w1": "http://127.0.0.1:1"},
            mode="layerwise",
            save=False,
        ),
    )


@pytest.mark.parametrize("stream", [True, False])
def test_encoded_request_validates_back_to_the_same_request(stream: bool) -> None:
    req = full_request()
    body = encode_generate(req, stream=stream)
    assert GenerateRequest.model_validate_json(body) == req.model_copy(update={"stream": stream})
    # The same JSON document pydantic itself would write.
    assert json.loads(body) == json.loads(req.model_copy(update={"stream": stream}).model_dump_json())


def test_a_request_built_without_validation_encodes_the_same() -> None:
    req = full_request()
    built = GenerateRequest.model_construct(**dict(req))
    assert encode_generate(built, stream=True) == encode_generate(req, stream=True)


def line(**fields: object) -> bytes:
    return json.dumps({"request_id": "r", **fields}).encode()


def test_token_chunks_of_one_read_merge_until_the_final_one() -> None:
    lines = [
        line(token_ids=[1], text="a", cached_tokens=3),
        b"",
        line(token_ids=[2, 3], text="bc", external_cached_tokens=5),
        line(token_ids=[4], finish_reason="length"),
        line(token_ids=[9]),  # after a final chunk: a new run
    ]
    chunks = decode_chunks(lines)
    assert [c.token_ids for c in chunks] == [[1, 2, 3, 4], [9]]
    first = chunks[0]
    assert (first.text, first.finish_reason, first.cached_tokens, first.external_cached_tokens) == (
        "abc",
        FinishReason.LENGTH,
        3,
        5,
    )


def test_merged_chunks_keep_one_logprob_entry_per_token_in_order() -> None:
    def lp(token: int) -> dict:
        return {"token_id": token, "logprob": -token / 10, "top": [[token, -token / 10]]}

    lines = [
        line(token_ids=[1], logprobs=[lp(1)]),
        line(token_ids=[2, 3], logprobs=[lp(2), lp(3)]),
        line(token_ids=[4], finish_reason="length", logprobs=[lp(4)]),
    ]
    (chunk,) = decode_chunks(lines)
    assert chunk.logprobs is not None
    assert [(e.token_id, e.logprob) for e in chunk.logprobs] == [(1, -0.1), (2, -0.2), (3, -0.3), (4, -0.4)]
    (plain,) = decode_chunks([line(token_ids=[1]), line(token_ids=[2])])
    assert plain.logprobs is None


def test_chunks_carrying_blocks_or_errors_or_another_request_stay_apart() -> None:
    saved = [BlockLocation(block_hash="cd" * 16, node_id="w0", slot=1)]
    chunks = [
        GenerateChunk(request_id="r", token_ids=[1], saved_blocks=saved),
        GenerateChunk(request_id="r", token_ids=[2]),
        GenerateChunk(request_id="q", token_ids=[3]),
        GenerateChunk(request_id="q", token_ids=[4], error="boom"),
        GenerateChunk(request_id="q", token_ids=[5]),
    ]
    merged = decode_chunks([c.model_dump_json(exclude_none=True).encode() for c in chunks])
    assert [(c.request_id, c.token_ids) for c in merged] == [("r", [1]), ("r", [2]), ("q", [3, 4]), ("q", [5])]
    assert merged[0].saved_blocks == saved and merged[2].error == "boom"


def test_merging_copies_the_documents_it_merges() -> None:
    first = {"request_id": "r", "token_ids": [1], "text": "a", "prompt_tokens": 4}
    (run,) = coalesce([first, {"request_id": "r", "token_ids": [2], "text": "b", "prompt_tokens": 9}])
    assert run["token_ids"] == [1, 2] and run["text"] == "ab" and run["prompt_tokens"] == 4
    assert first["token_ids"] == [1] and first["text"] == "a"


def test_lines_pydantic_reads_but_a_merge_cannot_stay_apart() -> None:
    chunks = decode_chunks([line(token_ids=[1]), line(token_ids=[2], cached_tokens="3")])
    assert [(c.token_ids, c.cached_tokens) for c in chunks] == [([1], 0), ([2], 3)]


def test_a_single_line_decodes_without_merging() -> None:
    assert decode_chunks([line(token_ids=[7], finish_reason="stop")]) == [
        GenerateChunk(request_id="r", token_ids=[7], finish_reason=FinishReason.STOP)
    ]
    assert decode_chunks([b"  ", b""]) == []


@pytest.mark.parametrize(
    "bad",
    [
        b"{not json",
        b"[1]",
        line(token_ids="x"),
        line(token_ids=[2], text=5),
        line(token_ids=[2], cached_tokens="many"),
        line(finish_reason="exploded"),
        line(unknown_field=1),
    ],
)
def test_a_line_that_is_not_a_chunk_is_named(bad: bytes) -> None:
    with pytest.raises(BadChunk, match="bad chunk from worker"):
        decode_chunks([line(token_ids=[1]), bad])
