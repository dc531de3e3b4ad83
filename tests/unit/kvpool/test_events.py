"""kvpool.events: the wire form of each KV event, strict decoding, best-effort publishing."""

from __future__ import annotations

import json
import pathlib
import socket

import pytest

from kvpool.events import (
    BlocksDropped,
    BlocksSaved,
    EventDecodeError,
    KVEvent,
    PeerChanged,
    PullDone,
    StepTimed,
    decode,
    encode,
    publish,
)

SAVED = BlocksSaved(rid="r.1", blocks=(("h0", 3), ("h1", 4)), external_tokens=32)
DROPPED = BlocksDropped(blocks=(("h0", 3),))
STEP = StepTimed(
    t=1700000000.5,
    elapsed_ms=12.25,
    prefill_requests=1,
    decode_requests=2,
    uncached_prompt_tokens=100,
    cached_prompt_tokens=32,
    generated_tokens=2,
    context_tokens=300,
    attention_pairs=10000,
)

PULL = PullDone(peer="wA", outcome="timeout", block_count=15, seconds=3.001, rid="chatcmpl-1-0", ended_at=1700000003.5)
PEER = PeerChanged(peer="wA", state="down", reason="timeout")

WIRE = [
    (
        PULL,
        {
            "type": "pull",
            "peer": "wA",
            "outcome": "timeout",
            "block_count": 15,
            "seconds": 3.001,
            "rid": "chatcmpl-1-0",
            "ended_at": 1700000003.5,
        },
    ),
    (PEER, {"type": "peer", "peer": "wA", "state": "down", "reason": "timeout"}),
    (SAVED, {"type": "saved", "rid": "r.1", "blocks": [["h0", 3], ["h1", 4]], "external_tokens": 32}),
    (DROPPED, {"type": "dropped", "blocks": [["h0", 3]]}),
    (
        STEP,
        {
            "type": "iteration",
            "t": 1700000000.5,
            "elapsed_ms": 12.25,
            "prefill_requests": 1,
            "decode_requests": 2,
            "uncached_prompt_tokens": 100,
            "cached_prompt_tokens": 32,
            "generated_tokens": 2,
            "context_tokens": 300,
            "attention_pairs": 10000,
        },
    ),
]


@pytest.mark.parametrize(("event", "wire"), WIRE)
def test_wire_form_has_type_first(event: KVEvent, wire: dict[str, object]) -> None:
    body = json.loads(encode(event))
    assert body == wire
    assert next(iter(body)) == "type"


@pytest.mark.parametrize("event", [SAVED, DROPPED, STEP, PULL, PEER, BlocksSaved(rid="r", blocks=())])
def test_encode_decode_round_trip(event: KVEvent) -> None:
    assert decode(encode(event)) == event


def test_defaults_apply_when_optional_fields_are_absent() -> None:
    assert decode(b'{"type": "saved", "rid": "r", "blocks": []}') == BlocksSaved(rid="r", blocks=())


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"not json", id="not-json"),
        pytest.param(b"\xff", id="not-utf8"),
        pytest.param(b'[{"type": "dropped", "blocks": []}]', id="a-list"),
        pytest.param(b'"dropped"', id="a-string"),
        pytest.param(b'{"type": "evicted", "blocks": []}', id="unknown-type"),
        pytest.param(b'{"blocks": []}', id="no-type"),
        pytest.param(b'{"type": "saved", "blocks": []}', id="missing-field"),
        pytest.param(b'{"type": "dropped", "blocks": [], "node": "n0"}', id="extra-field"),
        pytest.param(b'{"type": "dropped", "blocks": {"h0": 3}}', id="blocks-not-a-list"),
        pytest.param(b'{"type": "dropped", "blocks": [["h0"]]}', id="block-of-one"),
        pytest.param(b'{"type": "dropped", "blocks": [["h0", 3, 4]]}', id="block-of-three"),
        pytest.param(b'{"type": "dropped", "blocks": [["h0", "x"]]}', id="slot-not-int"),
        pytest.param(b'{"type": "dropped", "blocks": [7]}', id="block-a-number"),
        pytest.param(b'{"type": "dropped", "blocks": [null]}', id="block-null"),
        pytest.param(
            b'{"type": "pull", "peer": "a", "outcome": "lost", "block_count": 1, "seconds": 0}', id="bad-outcome"
        ),
        pytest.param(b'{"type": "peer", "peer": "a", "state": "gone"}', id="bad-peer-state"),
    ],
)
def test_decode_refuses(data: bytes) -> None:
    with pytest.raises(EventDecodeError):
        decode(data)


def test_decode_refuses_an_unhashable_type() -> None:
    with pytest.raises(EventDecodeError):
        decode(b'{"type": [], "blocks": []}')


def test_decode_refuses_a_string_block_entry() -> None:
    with pytest.raises(EventDecodeError):
        decode(b'{"type": "dropped", "blocks": ["a7"]}')


def test_publish_to_a_path_nobody_listens_on_does_not_raise(tmp_path: pathlib.Path) -> None:
    publish(str(tmp_path / "nobody.sock"), DROPPED)


def test_publish_delivers_one_datagram(tmp_path: pathlib.Path) -> None:
    path = str(tmp_path / "ev.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind(path)
        listener.settimeout(2.0)
        publish(path, SAVED)
        assert decode(listener.recv(65536)) == SAVED


def test_a_pull_event_without_its_request_still_decodes() -> None:
    # what a connector from before the request id was sent writes
    wire = b'{"type": "pull", "peer": "wA", "outcome": "ok", "block_count": 2, "seconds": 0.01}'
    assert decode(wire) == PullDone(peer="wA", outcome="ok", block_count=2, seconds=0.01)
