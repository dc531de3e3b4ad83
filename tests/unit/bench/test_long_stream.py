"""The long-stream case of `bench gateway`: the figure from CPU seconds and
tokens, the stream check, the summary, and the paced upstream driven by the
load generator end to end (8-token streams at 10 ms, in a second)."""

from __future__ import annotations

import time

import orjson
import pytest

from bench import _long_stream as ls
from bench.gateway_bench import MESSAGES, MODEL
from tests.unit.bench.test_gateway_bench import upstream


def sse(*events: dict | str) -> bytes:
    return b"".join(b"data: %s\n\n" % (e.encode() if isinstance(e, str) else orjson.dumps(e)) for e in events)


def token(text: str, finish: str | None = None) -> dict:
    return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]}


USAGE = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}}


@pytest.mark.parametrize(
    ("cpu_s", "tokens", "figure"),
    [
        (0.5, 100_000, 5000.0),  # 0.5 s over 100k tokens: 5 µs a token, 5,000 a thousand
        (2.0, 262_144, 7629.4),  # the default case's tokens (256 x 1,024)
        (0.0, 10, 0.0),
        (1.0, 0, None),  # nothing relayed: no figure, not a division by zero
    ],
)
def test_relay_cpu_per_1k_tokens(cpu_s: float, tokens: int, figure: float | None) -> None:
    assert ls.relay_cpu_us_per_1k(cpu_s, tokens) == figure


def test_the_ratio_is_the_gateway_over_vllm_router() -> None:
    assert ls.relay_ratio({"gateway": 3000.0, "vllm-router": 1500.0, "smg": 1.0}) == 2.0
    assert ls.relay_ratio({"gateway": 3000.0, "vllm-router": None}) is None
    assert ls.relay_ratio({"vllm-router": 1500.0}) is None


def test_the_config_says_how_long_a_stream_lasts() -> None:
    cfg = ls.LongStreamConfig(streams=256, tokens=1024, interval_ms=40.0)
    assert cfg.ideal_s == pytest.approx(1023 * 0.04) and cfg.tokens_per_s == 6400.0
    with pytest.raises(ValueError, match="tokens >= 2"):
        ls.LongStreamConfig(tokens=1)


def test_a_complete_stream_passes() -> None:
    body = sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}, token("a"), token("b"))
    body += sse(token("c", "length"), USAGE, "[DONE]")
    check = ls.check_sse(body)
    assert check == ls.StreamCheck(content_events=3, usage_tokens=3, finish_reason="length", done=True)
    assert check.problem(3) is None


@pytest.mark.parametrize(
    ("events", "problem"),
    [
        ((token("a"), token("b", "length"), USAGE), "no [DONE]"),
        ((token("a"), "[DONE]", USAGE), "no [DONE]"),  # [DONE] counts only last
        ((token("a"), token("b", "length"), "[DONE]"), "usage counts None tokens, not 3"),
        ((token("a"), token("b", "stop"), USAGE, "[DONE]"), "finish_reason 'stop'"),
        ((token("", "length"), USAGE, "[DONE]"), "0 content chunks for 3 tokens"),
    ],
)
def test_an_incomplete_stream_names_its_problem(events: tuple, problem: str) -> None:
    assert ls.check_sse(sse(*events)).problem(3) == problem


def test_quantiles_by_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert ls.quantile(values, 0.5) == 51.0 and ls.quantile(values, 0.99) == 99.0 and ls.quantile(values, 1.0) == 100
    assert ls.quantile([], 0.5) is None


def test_the_summary_takes_medians_and_drops_a_proxy_with_a_failed_stream() -> None:
    cfg = ls.LongStreamConfig(streams=2, tokens=8, interval_ms=10)
    rows = {
        "gateway": [{ls.KEY: 900.0, "failed": 0}, {ls.KEY: 1100.0, "failed": 0}, {ls.KEY: 5000.0, "failed": 0}],
        "vllm-router": [{ls.KEY: 500.0, "failed": 0}],
        "smg": [{ls.KEY: 400.0, "failed": 1}],
    }
    out = ls.summarize(rows, cfg)
    assert out[ls.KEY] == {"gateway": 1100.0, "vllm-router": 500.0, "smg": None}
    assert out["long_stream"]["relay_cpu_vs_vllm_router"] == 2.2 and out["long_stream"]["tokens_per_s"] == 200


async def test_the_load_generator_checks_paced_streams_from_the_upstream() -> None:
    cfg = ls.LongStreamConfig(streams=4, tokens=8, interval_ms=10)
    body = ls.chat_stream_body(MODEL, MESSAGES, cfg.tokens)
    async with upstream(token_interval_s=0.01, pace_from_tokens=8) as url:
        port = int(url.rsplit(":", 1)[1])
        t0 = time.monotonic()
        res = await ls.drive("127.0.0.1", port, "sk-bench", body, cfg)
        paced_s = time.monotonic() - t0
        short = ls.chat_stream_body(MODEL, MESSAGES, 4)  # under pace_from_tokens: one write
        quick = await ls.drive("127.0.0.1", port, "sk-bench", short, ls.LongStreamConfig(2, 4, 10))
    assert res["ok"] == 4 and res["failed"] == 0 and res["tokens"] == 32, res
    assert paced_s >= cfg.ideal_s and res["stream_s_p50"] >= cfg.ideal_s
    assert 5 <= res["gap_ms_p50"] <= 30  # one token a tick
    assert quick["ok"] == 2 and quick["tokens"] == 8 and quick["stream_s_max"] < cfg.ideal_s
