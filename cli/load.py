"""`evolving-infra load`: a shifting agent load against any OpenAI-compatible gateway.

    evolving-infra load --base-url http://127.0.0.1:8000 --api-key-file data/demo-api-key \\
        [--model demo-model] [--tokenizer data/demo-model] [--phase-s 180] [--cycles 2]

Alternates prefill-heavy phases (coding agents: OpenCode and Aider sessions,
long fresh tool output, short answers) and decode-heavy ones (reasoning
agents: tau-bench sessions, long answers), replayed closed loop from the
agent traces in `../shared/traces/agents` (`cli.load_plan` says exactly how).
Each request streams, with the branch headers of its agent session.

While a phase runs a progress bar is redrawn on stderr (a plain line every
`--report-s` seconds when stderr is not a terminal); when it ends one line
sums it up (`--json`: one JSON object per phase on stdout). Ctrl-C (or
SIGTERM) stops after finishing the branches in flight. Exit status 1 if
any request failed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import pathlib
import random
import signal
import sys
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx

from cli import load_plan as plan
from cli.load_stats import PhaseStats, RequestResult

DEFAULT_TRACES = "../shared/traces"
DECODE_SOURCES = ("agents/taubench",)
PREFILL_SOURCES = ("agents/opencode", "agents/aider")
R1_OUTPUTS = "servegen/reason/deepseek-r1/chunk-0-dataset.json"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="evolving-infra load", description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", required=True, help="gateway base URL (without /v1)")
    key = p.add_mutually_exclusive_group()
    key.add_argument("--api-key", default=None, help="tenant API key (default: $OPENAI_API_KEY)")
    key.add_argument("--api-key-file", default=None, help="file holding the API key (e.g. data/demo-api-key)")
    p.add_argument("--model", default=None, help="model id (default: the first of /v1/models)")
    p.add_argument(
        "--tokenizer",
        default=None,
        help="local tokenizer folder to size prompts (default: about 2.5 characters per token)",
    )
    p.add_argument("--traces", default=DEFAULT_TRACES, help=f"traces folder (default {DEFAULT_TRACES})")
    p.add_argument("--phase-s", type=float, default=plan.LoadConfig.phase_s, help="seconds per phase")
    p.add_argument(
        "--phases",
        default=",".join(k.value for k in plan.LoadConfig.phases),
        help="phase kinds in order, comma-separated: prefill, decode (repeated)",
    )
    p.add_argument("--cycles", type=int, default=None, help="rounds of --phases (default: until stopped)")
    p.add_argument("--duration-s", type=float, default=None, help="stop after this many seconds")
    p.add_argument("--agents-decode", type=int, default=plan.LoadConfig.agents_decode)
    p.add_argument("--agents-prefill", type=int, default=plan.LoadConfig.agents_prefill)
    p.add_argument("--max-context", type=int, default=plan.LoadConfig.max_context_tokens, help="model context, tokens")
    p.add_argument("--decode-output-mean", type=int, default=plan.LoadConfig.decode_output_mean)
    p.add_argument("--decode-output-max", type=int, default=plan.LoadConfig.decode_output_max)
    p.add_argument("--prefill-prompt", type=int, default=plan.LoadConfig.prefill_prompt_tokens, help="tokens")
    p.add_argument("--max-gap-s", type=float, default=plan.LoadConfig.max_gap_s, help="cap on tool time per turn")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--report-s", type=float, default=15.0, help="progress line period without a terminal")
    p.add_argument("--json", action="store_true", help="one JSON object per phase on stdout")
    p.add_argument("--timeout-s", type=float, default=600.0, help="per request")
    p.add_argument("--wait-ready-s", type=float, default=0.0, help="wait this long for the gateway's /readyz")
    return p


def config_from_args(a: argparse.Namespace) -> plan.LoadConfig:
    try:
        kinds = tuple(plan.PhaseKind(k.strip()) for k in a.phases.split(",") if k.strip())
    except ValueError as exc:
        raise ValueError(f"--phases takes prefill and decode, not {a.phases!r}") from exc
    return plan.LoadConfig(
        phase_s=a.phase_s,
        phases=kinds,
        agents_decode=a.agents_decode,
        agents_prefill=a.agents_prefill,
        max_context_tokens=a.max_context,
        decode_output_mean=a.decode_output_mean,
        decode_output_max=a.decode_output_max,
        prefill_prompt_tokens=a.prefill_prompt,
        max_gap_s=a.max_gap_s,
        seed=a.seed,
    )


def read_turns(traces: pathlib.Path, sources: Sequence[str]) -> list[plan.SourceTurn]:
    """Agent-text turns of `sources` (folders under `traces`), as the trace has them."""
    from sim.traces import load_agent_text

    out: list[plan.SourceTurn] = []
    for src in sources:
        folder = traces / src
        if not folder.is_dir():
            raise FileNotFoundError(f"trace folder {folder} not found (pass --traces)")
        files = sorted(f for f in folder.glob("*.jsonl") if f.stat().st_size > 0)
        _, turns = load_agent_text(files)
        out += [
            plan.SourceTurn(f"{src}:{t.request.session_id}", t.prompt, t.completion, t.request.gap_s) for t in turns
        ]
    return out


def r1_output_pdf(traces: pathlib.Path) -> plan.LengthPdf:
    import ast

    dataset = json.loads((traces / R1_OUTPUTS).read_text())
    first = dataset[min(dataset, key=int)]["output_tokens"]
    table = ast.literal_eval(first) if isinstance(first, str) else first
    return plan.LengthPdf.of({int(k): float(v) for k, v in table.items()})


def make_codec(tokenizer: str | None) -> plan.Codec:
    if tokenizer is None:
        return plan.CharCodec()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer)
    return plan.TokenizerCodec(
        encode=lambda s: tok.encode(s, add_special_tokens=False), decode=lambda ids: str(tok.decode(ids))
    )


def _has_token(chunk: dict[str, Any]) -> bool:
    """A chunk that carries output (the gateway's first chunk only names the role)."""
    return any((c.get("delta") or {}).get("content") or c.get("finish_reason") for c in chunk.get("choices") or [])


async def sse_lines(response: httpx.Response) -> AsyncIterator[str]:
    """The stream's lines, split at LF only, as Server-Sent Events are (`aiter_lines` also
    splits inside a JSON string at U+2028 and the other `str.splitlines` breaks)."""
    rest = b""
    async for data in response.aiter_bytes():
        *lines, rest = (rest + data).split(b"\n")
        for line in lines:
            yield line.rstrip(b"\r").decode()
    if rest:
        yield rest.decode()


class LoadRun:
    """The agents of one phase at a time, through one HTTP client."""

    def __init__(self, client: httpx.AsyncClient, model: str, run_id: str, *, json_out: bool, report_s: float) -> None:
        self.client = client
        self.model = model
        self.run_id = run_id
        self.json_out = json_out
        self.report_s = report_s
        self.stopping = asyncio.Event()
        self.in_flight = 0
        self._branches = 0

    async def turn(self, headers: dict[str, str], t: plan.Turn) -> RequestResult:
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": t.prompt(headers["X-Branch-ID"])}],
            "max_tokens": t.max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        t0 = time.perf_counter()
        ttft: float | None = None
        usage: dict[str, Any] = {}
        self.in_flight += 1
        try:
            async with self.client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
                if r.status_code != 200:
                    text = (await r.aread()).decode(errors="replace")[:200]
                    return self._failed(t0, None, f"HTTP {r.status_code}: {text}")
                async for line in sse_lines(r):
                    if not line.startswith("data:") or line.strip() == "data: [DONE]":
                        continue
                    chunk = json.loads(line[5:])
                    if chunk.get("usage"):
                        usage = chunk["usage"]
                    if ttft is None and _has_token(chunk):
                        ttft = time.perf_counter() - t0
        except (httpx.HTTPError, json.JSONDecodeError) as exc:
            return self._failed(t0, ttft, f"{type(exc).__name__}: {exc}")
        finally:
            self.in_flight -= 1
        details = usage.get("prompt_tokens_details") or {}
        return RequestResult(
            True,
            time.perf_counter() - t0,
            ttft,
            int(usage.get("prompt_tokens", 0)),
            int(details.get("cached_tokens", 0) or 0),
            int(usage.get("completion_tokens", 0)),
        )

    def _failed(self, t0: float, ttft: float | None, error: str) -> RequestResult:
        return RequestResult(False, time.perf_counter() - t0, ttft, error=error, interrupted=self.stopping.is_set())

    async def agent(self, i: int, deck: plan.SessionDeck, stats: PhaseStats, deadline: float) -> None:
        """Sessions one after another until the phase ends; the branch in flight is finished."""
        while time.monotonic() < deadline and not self.stopping.is_set():
            session = deck.next()
            self._branches += 1
            sid = f"{self.run_id}-p{stats.number}-a{i}-{self._branches}"
            base = {"X-Session-ID": sid, "X-Branch-ID": f"{sid}:main"}
            finished = False
            for n, t in enumerate(session.turns):
                if n and t.gap_s > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.stopping.wait(), t.gap_s)
                last = t.last or time.monotonic() >= deadline or self.stopping.is_set()
                stats.add(await self.turn({**base, **({"X-Branch-Finished": "true"} if last else {})}, t))
                if last:
                    finished = True
                    break
            if not finished:  # every turn failed or ran out: release the branch's blocks
                with contextlib.suppress(httpx.HTTPError):
                    await self.client.post(f"/v1/branches/{base['X-Branch-ID']}/finish")

    async def phase(self, number: int, kind: plan.PhaseKind, deck: plan.SessionDeck, config: plan.LoadConfig) -> dict:
        stats = PhaseStats(number, kind, config.agents(kind))
        t0 = time.monotonic()
        deadline = t0 + config.phase_s
        tasks = [asyncio.create_task(self.agent(i, deck, stats, deadline)) for i in range(stats.agents)]
        tty = sys.stderr.isatty()
        last_report = t0
        while not all(t.done() for t in tasks):
            await asyncio.sleep(0.5)
            now = time.monotonic()
            if tty:
                print("\r" + stats.progress(now - t0, config.phase_s, self.in_flight), end="", file=sys.stderr)
            elif now - last_report >= self.report_s:
                print(stats.progress(now - t0, config.phase_s, self.in_flight), file=sys.stderr, flush=True)
                last_report = now
        for t in tasks:
            t.result()  # an agent's bug surfaces here, not silently
        elapsed = time.monotonic() - t0
        if tty:
            print("\r\033[K", end="", file=sys.stderr)
        summary = stats.summary(elapsed)
        print(json.dumps(summary) if self.json_out else stats.line(elapsed), flush=True)
        return summary


async def wait_ready(client: httpx.AsyncClient, timeout_s: float) -> None:
    """Until /readyz answers 200 (at most `timeout_s`; then the first request says what is wrong)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if (await client.get("/readyz")).status_code == 200:
                return
        await asyncio.sleep(0.5)


async def first_model(client: httpx.AsyncClient) -> str:
    r = await client.get("/v1/models")
    r.raise_for_status()
    return str(r.json()["data"][0]["id"])


async def run(a: argparse.Namespace, config: plan.LoadConfig, key: str | None) -> int:
    traces = pathlib.Path(a.traces)
    codec = make_codec(a.tokenizer)
    decks = {
        plan.PhaseKind.DECODE_HEAVY: plan.decode_sessions(
            read_turns(traces, DECODE_SOURCES), config, codec, r1_output_pdf(traces)
        ),
        plan.PhaseKind.PREFILL_HEAVY: plan.prefill_sessions(read_turns(traces, PREFILL_SOURCES), config, codec),
    }
    rng = random.Random(config.seed)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    timeout = httpx.Timeout(a.timeout_s, connect=10.0)
    limits = httpx.Limits(max_connections=config.agents_decode + config.agents_prefill + 4)
    async with httpx.AsyncClient(base_url=a.base_url.rstrip("/"), headers=headers, timeout=timeout, limits=limits) as c:
        await wait_ready(c, a.wait_ready_s)
        model = a.model or await first_model(c)
        load = LoadRun(c, model, f"load-{os.getpid()}-{int(time.time())}", json_out=a.json, report_s=a.report_s)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, load.stopping.set)
        started = time.monotonic()
        errors = 0
        for number, kind in plan.phase_sequence(config, a.cycles):
            left = None if a.duration_s is None else a.duration_s - (time.monotonic() - started)
            if load.stopping.is_set() or (left is not None and left <= 0):
                break
            phase_config = config if left is None or left >= config.phase_s else _shorter(config, left)
            deck = plan.SessionDeck(decks[kind], random.Random(rng.random()))
            errors += (await load.phase(number, kind, deck, phase_config))["errors"]
    return 1 if errors else 0


def _shorter(config: plan.LoadConfig, phase_s: float) -> plan.LoadConfig:
    import dataclasses

    return dataclasses.replace(config, phase_s=phase_s)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    a = parser.parse_args(argv)
    try:
        config = config_from_args(a)
    except ValueError as exc:
        parser.error(str(exc))
    if a.api_key_file:
        key: str | None = pathlib.Path(a.api_key_file).read_text().strip()
    else:
        key = a.api_key or os.environ.get("OPENAI_API_KEY")
    try:
        return asyncio.run(run(a, config, key))
    except FileNotFoundError as exc:
        print(f"evolving-infra load: {exc}", file=sys.stderr)
        return 2
    except httpx.HTTPError as exc:
        print(f"evolving-infra load: cannot reach {a.base_url}: {exc}", file=sys.stderr)
        return 2
