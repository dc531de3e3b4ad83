"""Loaders on small slices of each trace format (read at test time from ../shared/traces)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sim import traces

T = Path(__file__).resolve().parents[4] / "shared" / "traces"
pytestmark = pytest.mark.skipif(not T.exists(), reason="../shared/traces not present")


def test_mooncake_slice() -> None:
    w = traces.load_mooncake(T / "mooncake" / "conversation_trace.jsonl", limit=50)
    assert len(w.requests) == 50 and w.block_tokens == 512
    r = w.requests[0]
    assert r.arrival_s == 0.0 and r.block_hashes[0] == 0 and not r.after
    assert [x.req_id for x in w.requests] == list(range(50))


def test_mooncake_style_sessions_are_closed_loop() -> None:
    w = traces.load_mooncake(T / "agents" / "mooncake_style" / "opencode.jsonl", limit=10)
    first, second = w.requests[0], w.requests[1]
    assert first.session_id == second.session_id == "opencode:gpt-5-mini-task1"
    assert second.after == (0,) and second.gap_s > 0 and not first.last_in_branch
    assert second.block_hashes[:5] == first.block_hashes[:5]  # shared prefix


def test_azure_slice() -> None:
    w = traces.load_azure(T / "azure" / "AzureLLMInferenceTrace_code.csv", limit=20)
    assert len(w.requests) == 20 and w.requests[0].arrival_s == 0.0
    assert (w.requests[0].prompt_tokens, w.requests[0].output_tokens) == (4808, 10)
    assert not w.closed_loop and all(not r.block_hashes for r in w.requests)


def test_agent_text_units_and_tokenizer() -> None:
    class Chars:
        def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
            return list(range(len(text)))

    w, turns = traces.load_agent_text(T / "agents" / "taubench" / "24c817382a29e399b7dac064b923c268.jsonl", Chars())
    assert len(turns) == 3
    # timestamps in µs: 1,585.8 ms between the first two rows
    assert w.requests[1].arrival_s == pytest.approx(1.585785, abs=1e-6)
    assert w.requests[0].prompt_tokens == len("Hi! How can I help you today?")
    assert turns[1].prompt.startswith("I just received")


def test_timestamp_units() -> None:
    assert traces.timestamp_seconds(1_760_587_666_509_217) == pytest.approx(1_760_587_666.509217)
    assert traces.timestamp_seconds(1_769_792_217_450) == pytest.approx(1_769_792_217.45)


def test_servegen_sampling_is_seeded() -> None:
    folder = T / "servegen" / "reason" / "deepseek-r1"
    a = traces.load_servegen(folder, seed=3, duration_s=600, start_s=36_000, clients=[5])
    b = traces.load_servegen(folder, seed=3, duration_s=600, start_s=36_000, clients=[5])
    assert a.requests == b.requests and len(a.requests) > 0
    assert all(0 <= r.arrival_s < 600 for r in a.requests)
