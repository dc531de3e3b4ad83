"""`bench gateway`'s parts: the upstream speaks both protocols correctly (its
chunks are the worker protocol's, its SSE the OpenAI chunks), the load
tools parse what they measure, the report computes the issue's keys."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from bench import gateway_upstream
from bench._stall import stall_case
from bench._wrk import POST_LUA, run_wrk
from bench.gateway_bench import chat_body, headline, summarize, whole_token_ids
from gateway.serving.openai.schemas import ChatCompletion, ChatCompletionChunk
from gateway.upstream.raw_client import RawWorkerClient
from workers.protocol import GenerateRequest, SamplingOptions, WorkerStats


@contextlib.asynccontextmanager
async def upstream(**cfg) -> AsyncIterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    task = asyncio.ensure_future(gateway_upstream.serve(gateway_upstream.UpstreamConfig(**cfg), "127.0.0.1", port))
    url = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient() as client:
        for _ in range(100):
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(f"{url}/health")).status_code == 200:
                    break
            await asyncio.sleep(0.02)
    try:
        yield url
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def generate(rid: str, n: int, *, prompt: int = 20, **kw) -> GenerateRequest:
    return GenerateRequest(
        request_id=rid, prompt_token_ids=list(range(10, 10 + prompt)), sampling=SamplingOptions(max_tokens=n), **kw
    )


async def test_the_upstream_speaks_the_worker_protocol() -> None:
    client = RawWorkerClient()
    async with upstream(vocab=(10, 800)) as url:
        chunks = [c async for c in client.generate_stream(url, generate("a", 16))]
        tokens = [t for c in chunks for t in c.token_ids]
        assert len(tokens) == 16 and all(10 <= t < 800 for t in tokens)
        assert chunks[-1].finish_reason is not None and chunks[-1].request_id == "a"
        one = await client.generate(url, generate("p", 16, role="prefill"))
        assert len(one.token_ids) == 1 and one.prompt_tokens == 20
        big = [c async for c in client.generate_stream(url, generate("big", 4, prompt=100_000))]  # not JSON-parsed
        assert sum(len(c.token_ids) for c in big) == 4 and big[-1].request_id == "big"
        async with httpx.AsyncClient() as h:
            WorkerStats.model_validate_json((await h.get(f"{url}/internal/stats")).content)
    await client.aclose()
    assert gateway_upstream.tokens_for(3, 5, (10, 20)) == gateway_upstream.tokens_for(3, 5, (10, 20))


async def test_the_upstream_draws_from_the_ids_it_is_given() -> None:
    client = RawWorkerClient()
    async with upstream(token_ids=(40, 41, 97)) as url:
        chunks = [c async for c in client.generate_stream(url, generate("a", 32))]
    await client.aclose()
    tokens = [t for c in chunks for t in c.token_ids]
    assert len(tokens) == 32 and set(tokens) <= {40, 41, 97} and len(set(tokens)) > 1


def test_whole_token_ids_give_one_text_delta_per_token(tmp_path) -> None:
    """The ids `bench gateway` streams decode to a delta at every token; the
    whole range does not (byte pieces of multi-byte characters)."""
    from tokenizers import Tokenizer
    from tokenizers.decoders import DecodeStream

    from testing.tiny_tokenizer import write_tiny_tokenizer

    path = write_tiny_tokenizer(tmp_path / "tok") / "tokenizer.json"
    tok = Tokenizer.from_file(str(path))
    ids = whole_token_ids(path)

    def silent(seq: list[int]) -> int:
        stream = DecodeStream(skip_special_tokens=True)
        return sum(1 for i in seq if not stream.step(tok, i))

    assert 100 < len(ids) < tok.get_vocab_size() - 10
    assert silent(gateway_upstream.tokens_for(7, 2048, (10, 0), ids)) == 0
    assert silent(gateway_upstream.tokens_for(7, 2048, (10, tok.get_vocab_size()))) > 100


async def test_the_upstream_speaks_openai_sse_and_json() -> None:
    async with upstream() as url, httpx.AsyncClient() as h:
        plain = await h.post(f"{url}/v1/chat/completions", content=chat_body(stream=False, tokens=5))
        assert ChatCompletion.model_validate(plain.json()).usage.completion_tokens == 5
        lines = (await h.post(f"{url}/v1/chat/completions", content=chat_body(stream=True, tokens=5))).text.split(
            "\n\n"
        )
        events = [line.removeprefix("data: ") for line in lines if line]
        assert events[-1] == "[DONE]"
        chunks = [ChatCompletionChunk.model_validate_json(e) for e in events[:-1]]
        assert len(chunks) == 6 and chunks[-1].choices[0].finish_reason == "length"


async def test_the_stall_case_reports_both_probes() -> None:
    async with upstream() as url:
        port = int(url.rsplit(":", 1)[1])
        out = await stall_case(
            "127.0.0.1",
            port,
            small_body=chat_body(stream=True, tokens=4),
            big_body=chat_body(stream=True, tokens=4, content="x" * 300_000),
            streams=3,
            think_s=0.01,
            warm_s=0.1,
            baseline_s=0.3,
            after_s=0.1,
            health_path="/healthz",
        )
    assert out["big"]["status"] == 200 and out["small_errors"] == 0 and out["small_requests"] > 10
    assert set(out["small"]) == {
        "baseline_p50_ms",
        "baseline_max_ms",
        "overlap_requests",
        "overlap_worst_ms",
        "stall_ms",
    }
    assert out["stall_ms"] == max(out["small"]["stall_ms"], out["healthz"]["stall_ms"])


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed")
async def test_wrk_runs_are_parsed_with_cpu_accounting(tmp_path) -> None:
    import os

    lua, body = tmp_path / "post.lua", tmp_path / "body.json"
    lua.write_text(POST_LUA)
    body.write_bytes(chat_body(stream=True, tokens=4))
    async with upstream() as url:
        loop = asyncio.get_running_loop()
        row: dict[str, Any] = await loop.run_in_executor(
            None,
            lambda: run_wrk(
                f"{url}/v1/chat/completions", body, lua, concurrency=2, duration_s=1, pids={"me": os.getpid()}
            ),
        )
    assert row["requests"] > 0 and row["non2xx"] == 0 and row["errors"] == 0, row
    assert row["p50_ms"] <= row["p99_ms"] and row["cpu_us_per_request"]["me"] > 0


def test_the_report_keys_are_computed_against_direct_at_the_same_level() -> None:
    def row(target, c, rps, p50, p99, rnd, proxy=100.0):
        cpu = {"upstream": 20.0} | ({} if target == "direct" else {"proxy": proxy})
        return {"target": target, "mode": "stream", "c": c, "rps": rps, "p50_ms": p50, "p99_ms": p99, "round": rnd,
                "cpu_us_per_request": cpu, "errors": 0, "non2xx": 0, "machine_busy": 0.5}  # fmt: skip

    rows = [
        row("direct", 1, 20000, 0.05, 0.2, 0),
        row("direct", 1, 22000, 0.07, 0.4, 1),
        row("direct", 32, 30000, 1.0, 2.0, 0),
        row("gateway", 1, 900, 1.0, 3.0, 0, proxy=800),
        row("gateway", 1, 1100, 1.2, 2.6, 1, proxy=900),
        row("gateway", 32, 1500, 20.0, 60.0, 0),
    ]
    summary = summarize(rows)
    assert summary["gateway"]["stream"]["1"]["proxy_cpu_us"] == 850.0
    keys = headline(summary, "gateway", "stream")
    assert keys["overhead_p50_ms"] == pytest.approx(1.1 - 0.06)
    assert keys["overhead_p99_ms"] == pytest.approx(2.8 - 0.3)
    assert keys["ratio_vs_direct_c32"] == 0.05 and keys["p99_ms_c32"] == 60.0 and keys["p99_vs_direct_c32"] == 30.0
    assert json.dumps(keys)
