"""`evolving-infra bench gateway`: what the gateway costs per request, side by
side with vllm-router and smg in front of the same upstream.

One upstream process (`bench.gateway_upstream`: raw asyncio + httptools,
~20 µs of CPU per request) answers both the OpenAI routes and the worker
protocol with the same `--tokens` tokens and no delay. Four targets, each
its own process, all started once and kept running:

    direct       wrk -> upstream /v1/chat/completions
    gateway      wrk -> evolving-infra gateway -> upstream /internal/generate
                 (as `evolving-infra gateway` serves it: API keys checked against a
                 SQLite store, tenant policy and admission, chat template and
                 tokenization, block hashes and prefix lookup, routing, detokenizing)
    vllm-router  wrk -> vllm-router (round robin) -> upstream /v1/chat/completions
    smg          wrk -> smg (round robin, no tokenizer) -> upstream /v1/chat/completions

Load: wrk (`bench._wrk`), streaming and non-streaming chat completions, at
each `--concurrency`, `--duration` seconds per run, in `--rounds` rounds
that interleave the targets (noise from other work spreads over all of
them); figures are medians over the rounds. Placement on a 2-core machine:
the proxy under test alone on cpu0, wrk and the upstream on cpu1 (direct
runs the same way with nothing on cpu0).

Keys (streaming; `by_mode` has both modes): `overhead_p50_ms` /
`overhead_p99_ms` = target - direct at concurrency 1; `ratio_vs_direct_c32`
= requests/s at 32 over direct's; `p99_ms_c32`; `ratio_vs_peers_c32` =
ours over each peer's; `peers` = the same keys per peer; `cpu_us_per_request`
per target, the steadiest figure here; `tracing_overhead_cpu` = CPU per
request with OpenTelemetry traces on at ratio 1.0 over off (`bench._tracing`:
three extra pairs of runs per round; `--skip-tracing` leaves it out).

The stall case (`bench._stall`): 32 small streams and a /healthz probe while
one 3.5 MB prompt (~660k tokens) goes through the gateway, accepted and
tokenized in full (`stall`); the same prompt with the model's context
limit set, refused before tokenizing (`stall_refused`); and a control run
with no big prompt (`stall_control`: the machine's own noise, measured the
same way).

The long-stream case (`bench._long_stream`): 256 concurrent streams of
1,024 tokens, the upstream pacing them at one token per stream every
`--long-interval-ms` (40: 6,400 tokens/s in all), through each proxy in
turn; `relay_cpu_us_per_1k_tokens` = the proxy's CPU per 1,000 tokens
relayed (`--skip-long-stream` leaves it out).

`--stages` adds `stages_c32` (`bench._stages`): a gateway process of its
own, its per-request stages timed where they run during one streamed wrk
run at 32 (µs a request per stage, with and without the stages inside it,
and the share of the process's CPU they account for).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import pathlib
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import httpx

from bench import _long_stream, _stages, _tracing
from bench._stall import big_prompt, stall_case
from bench._wrk import POST_LUA, run_wrk, wrk_path

MODEL = "bench"
MESSAGES = [
    {"role": "system", "content": "You are a benchmark."},
    {"role": "user", "content": "Agents call tools, read their results and continue."},
]
PEERS = ("vllm-router", "smg")
TARGETS = ("direct", "gateway", *PEERS)
PROXY_CPU, LOAD_CPU = "0", "1"
TARGETS_TEXT = {"overhead_p50_ms": 1.0, "overhead_p99_ms": 3.0, "ratio_vs_direct_c32": 0.5, "p99_vs_direct_c32": 3.0}
TARGETS_TEXT["stall_ms"] = 50.0


def whole_token_ids(tokenizer_json: pathlib.Path, lo: int = 10) -> list[int]:
    """The tokenizer's ids from `lo` up whose text is whole on its own: not a
    special token, not a piece of a UTF-8 character. A stream of them gives
    one text delta per token, as the peers' upstream streams do (one " tok"
    a token) and as a model's text mostly does. Drawn from the whole
    vocabulary, ~28 % of the tiny tokenizer's ids are byte pieces, which
    any detokenizer holds back until the character is whole: the gateway
    then wrote ~0.7 events a token and the long-stream case saw gaps of
    up to five token intervals that came from the ids, not the relay."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    out = []
    for i in range(lo, tok.get_vocab_size()):
        text = tok.decode([i], skip_special_tokens=True)
        if text and "\ufffd" not in text:
            out.append(i)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def chat_body(*, stream: bool, tokens: int, content: str | None = None) -> bytes:
    messages = MESSAGES if content is None else [{"role": "user", "content": content}]
    return json.dumps({"model": MODEL, "messages": messages, "max_tokens": tokens, "stream": stream}).encode()


# -- the gateway process (re-entered through --serve gateway) ------------------------
def serve_gateway(port: int, tokenizer_dir: str, upstream: str, data_dir: str, max_prompt_tokens: int | None) -> None:
    if os.environ.get(_stages.ENV):  # the stages case: its functions timed in place, before the app is built
        _stages.install(os.environ[_stages.ENV])
    from cli.demo_key import demo_key
    from core.tracing import TraceSettings
    from gateway.compose import ControlPlane, compose_app
    from gateway.settings import GatewaySettings

    # Left at its default unless asked for.
    limits: dict[str, Any] = {"max_prompt_tokens": max_prompt_tokens} if max_prompt_tokens else {}
    settings = GatewaySettings(
        model_dir=tokenizer_dir,
        model_name=MODEL,
        worker_urls=(upstream,),
        port=port,
        data_dir=data_dir,
        heartbeat_interval_s=1.0,
        tokenize_process="warm",  # as the chart deploys it: the big-prompt tokenizer's process started with the app
        tracing=TraceSettings.from_otel_env(os.environ),  # on for the tracing case (bench._tracing)
        **limits,
    )
    cp = ControlPlane.build(settings)
    demo_key(cp, data_dir)  # writes <data_dir>/demo-api-key for the load generator
    app = compose_app(settings, control_plane=cp)
    try:
        from gateway.http.server import serve_app
    except ImportError:  # this harness run over an older source tree (a before/after comparison)
        import uvicorn

        uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)
        return
    serve_app(app, host="127.0.0.1", port=port, log_level="warning")


# -- processes -------------------------------------------------------------------------
@contextlib.contextmanager
def process(
    argv: list[str], ready_url: str, log: pathlib.Path, *, cpu: str | None, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    cmd = ["taskset", "-c", cpu, *argv] if cpu is not None and shutil.which("taskset") else argv
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{argv[:3]} exited: {log.read_text()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(ready_url, timeout=1.0).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{argv[:3]} not ready: {log.read_text()[-2000:]}")
            time.sleep(0.3)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _bin(name: str) -> str | None:
    local = pathlib.Path(sys.executable).with_name(name)
    return str(local) if local.exists() else shutil.which(name)


def peer_argv(name: str, port: int, upstream: str, metrics_port: int) -> list[str] | None:
    common = ["--host", "127.0.0.1", "--port", str(port), "--worker-urls", upstream, "--policy", "round_robin"]
    common += ["--worker-startup-check-interval", "1", "--prometheus-port", str(metrics_port)]
    common += ["--prometheus-host", "127.0.0.1"]
    if name == "vllm-router":
        exe = _bin("vllm-router")
        return None if exe is None else [exe, *common, "--log-level", "warning"]
    exe = _bin("smg")
    extra = ["--log-level", "warn", "--disable-tokenizer-autoload", "--disable-load-monitoring"]
    return None if exe is None else [exe, "launch", *common, *extra]


def check_target(url: str, api_key: str, tokens: int) -> None:
    """One streaming and one plain request, checked, before a target is measured."""
    headers = {"Authorization": f"Bearer {api_key}", "content-type": "application/json"}
    with httpx.Client(timeout=30) as client:
        r = client.post(url, content=chat_body(stream=False, tokens=tokens), headers=headers)
        r.raise_for_status()
        body = r.json()
        assert body["choices"][0]["finish_reason"] == "length", body
        text = ""
        done = False
        with client.stream("POST", url, content=chat_body(stream=True, tokens=tokens), headers=headers) as s:
            s.raise_for_status()
            for line in s.iter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    for choice in json.loads(line[6:]).get("choices", []):
                        text += choice.get("delta", {}).get("content") or ""
        assert done and text, f"{url}: stream without [DONE] or text"


# -- the run -----------------------------------------------------------------------------
def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [float(r[key]) for r in rows if r.get(key) is not None]
    return round(statistics.median(values), 3) if values else None


def summarize(rows: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, dict[str, Any]]]]:
    """target -> mode -> concurrency -> medians over the rounds."""
    out: dict[str, dict[str, dict[str, dict[str, Any]]]] = {}
    for target in {r["target"] for r in rows}:
        for mode in {r["mode"] for r in rows}:
            for c in sorted({r["c"] for r in rows}):
                sel = [r for r in rows if (r["target"], r["mode"], r["c"]) == (target, mode, c) and "rps" in r]
                if not sel:
                    continue
                cpu = [r["cpu_us_per_request"].get("proxy") for r in sel]
                up_cpu = [r["cpu_us_per_request"]["upstream"] for r in sel]
                out.setdefault(target, {}).setdefault(mode, {})[str(c)] = {
                    "rps": _median(sel, "rps"),
                    "p50_ms": _median(sel, "p50_ms"),
                    "p99_ms": _median(sel, "p99_ms"),
                    "proxy_cpu_us": round(statistics.median(cpu), 1) if all(x is not None for x in cpu) else None,
                    "upstream_cpu_us": round(statistics.median(up_cpu), 1),
                    "errors": sum(int(r.get("errors", 0)) + int(r.get("non2xx", 0)) for r in sel),
                    "machine_busy": _median(sel, "machine_busy"),
                    "rounds": len(sel),
                }
    return out


def headline(summary: dict[str, Any], target: str, mode: str) -> dict[str, Any]:
    """The issue's keys for one target and mode (None where a level was not run)."""
    me, direct = summary.get(target, {}).get(mode, {}), summary["direct"].get(mode, {})
    one, d1, c32, d32 = me.get("1"), direct.get("1"), me.get("32"), direct.get("32")
    out: dict[str, Any] = {
        "overhead_p50_ms": round(one["p50_ms"] - d1["p50_ms"], 3) if one and d1 else None,
        "overhead_p99_ms": round(one["p99_ms"] - d1["p99_ms"], 3) if one and d1 else None,
        "ratio_vs_direct_c32": round(c32["rps"] / d32["rps"], 4) if c32 and d32 else None,
        "p99_ms_c32": c32["p99_ms"] if c32 else None,
        "p99_vs_direct_c32": round(c32["p99_ms"] / d32["p99_ms"], 2) if c32 and d32 else None,
        "rps_c32": c32["rps"] if c32 else None,
    }
    out["cpu_us_per_request"] = {c: v["proxy_cpu_us"] for c, v in me.items()} if target != "direct" else None
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="evolving-infra bench gateway", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="print only the JSON result")
    p.add_argument("--tokens", type=int, default=16, help="tokens per response")
    p.add_argument("--concurrency", default="1,32,64", help="comma-separated levels")
    p.add_argument("--modes", default="stream,plain")
    p.add_argument("--duration", type=float, default=5.0, help="seconds per wrk run")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--targets", default=",".join(TARGETS), help="subset of " + ",".join(TARGETS))
    p.add_argument("--skip-stall", action="store_true")
    p.add_argument("--skip-tracing", action="store_true", help="leave out tracing_overhead_cpu")
    p.add_argument("--skip-long-stream", action="store_true", help="leave out relay_cpu_us_per_1k_tokens")
    p.add_argument("--long-streams", type=int, default=256, help="concurrent streams of the long-stream case")
    p.add_argument("--long-tokens", type=int, default=1024, help="tokens per stream of the long-stream case")
    p.add_argument("--long-interval-ms", type=float, default=40.0, help="token interval per long stream")
    p.add_argument("--long-rounds", type=int, default=1, help="runs of the long-stream case per proxy")
    p.add_argument("--big-mb", type=float, default=3.5, help="size of the stall case's prompt")
    p.add_argument("--no-pin", action="store_true", help="do not pin proxy / load to cpu0 / cpu1")
    p.add_argument("--stages", action="store_true", help="add stages_c32: in-place µs per stage (bench._stages)")
    p.add_argument("--serve", choices=["gateway"], help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--tokenizer", help=argparse.SUPPRESS)
    p.add_argument("--upstream", help=argparse.SUPPRESS)
    p.add_argument("--data-dir", help=argparse.SUPPRESS)
    p.add_argument("--max-prompt-tokens", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve == "gateway":
        serve_gateway(args.port, args.tokenizer, args.upstream, args.data_dir, args.max_prompt_tokens)
        return 0
    result = run_bench(args)
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


class _Rig:
    """The processes one run measures, started once and kept running: the
    upstream, the proxies (`urls`, `procs`, `keys` by target name) and the
    files wrk reads (`lua`, `bodies`), in `tmp`, stopped with `stack`."""

    def __init__(self, args: argparse.Namespace, tmp: pathlib.Path, stack: contextlib.ExitStack) -> None:
        from testing.tiny_tokenizer import write_tiny_tokenizer

        self.args, self.tmp, self.stack = args, tmp, stack
        pin = not args.no_pin and (os.cpu_count() or 1) >= 2
        self.proxy_cpu: str | None = PROXY_CPU if pin else None
        self.load_cpu: str | None = LOAD_CPU if pin else None
        self.tok = str(write_tiny_tokenizer(tmp / "tokenizer"))
        self.lua = tmp / "post.lua"
        self.lua.write_text(POST_LUA)
        self.bodies = {m: tmp / f"body_{m}.json" for m in ("stream", "plain")}
        for m, path in self.bodies.items():
            path.write_bytes(chat_body(stream=m == "stream", tokens=args.tokens))
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.keys: dict[str, str] = {}
        self.long_cfg: _long_stream.LongStreamConfig | None = None
        if not args.skip_long_stream:  # the same upstream paces the long streams only
            self.long_cfg = _long_stream.LongStreamConfig(args.long_streams, args.long_tokens, args.long_interval_ms)
            if args.tokens >= self.long_cfg.tokens:
                raise SystemExit("--tokens must be below --long-tokens (the upstream paces streams that long)")
        self.upstream, self.up = self._start_upstream()
        self.urls: dict[str, str] = {"direct": self.upstream}

    def _start_upstream(self) -> tuple[str, subprocess.Popen[bytes]]:
        ids_file = self.tmp / "token_ids.json"
        ids_file.write_text(json.dumps(whole_token_ids(self.tmp / "tokenizer" / "tokenizer.json")))
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        argv = [sys.executable, "-m", "bench.gateway_upstream", "--port", str(port), "--token-ids-file", str(ids_file)]
        if self.long_cfg is not None:
            argv += ["--token-interval-ms", str(self.long_cfg.interval_ms)]
            argv += ["--pace-from-tokens", str(self.long_cfg.tokens)]
        proc = self.stack.enter_context(process(argv, f"{url}/health", self.tmp / "upstream.log", cpu=self.load_cpu))
        return url, proc

    def start_gateway(self, name: str, max_prompt_tokens: int | None = None, env: dict[str, str] | None = None) -> str:
        port = free_port()
        data = self.tmp / name
        argv = [sys.executable, "-m", "bench.gateway_bench", "--serve", "gateway", "--port", str(port)]
        argv += ["--tokenizer", self.tok, "--upstream", self.upstream, "--data-dir", str(data)]
        argv += ["--max-prompt-tokens", str(max_prompt_tokens)] if max_prompt_tokens else []
        url = f"http://127.0.0.1:{port}"
        log = self.tmp / f"{name}.log"
        self.procs[name] = self.stack.enter_context(process(argv, f"{url}/readyz", log, cpu=self.proxy_cpu, env=env))
        self.keys[name] = (data / "demo-api-key").read_text().strip()
        return url

    def start_tracing(self) -> tuple[str, str]:
        """The OTLP receiver and a gateway tracing every request to it: (its URL, the receiver's)."""
        rx_port = free_port()
        receiver_url = f"http://127.0.0.1:{rx_port}"
        rx_argv = _tracing.receiver_argv(rx_port)
        self.stack.enter_context(process(rx_argv, f"{receiver_url}/stats", self.tmp / "otlp.log", cpu=self.load_cpu))
        return self.start_gateway(_tracing.ON, env=_tracing.traced_env(receiver_url)), receiver_url

    def start_peers(self, wanted: list[str], notes: list[str]) -> None:
        for name in PEERS:
            if name not in wanted:
                continue
            port = free_port()
            argv = peer_argv(name, port, self.upstream, free_port())
            if argv is None:
                notes.append(f"{name} is not installed (pip install '.[bench]'): skipped")
                continue
            url = f"http://127.0.0.1:{port}"
            log = self.tmp / f"{name}.log"
            self.procs[name] = self.stack.enter_context(process(argv, f"{url}/readiness", log, cpu=self.proxy_cpu))
            self.urls[name] = url

    def wrk(self, url: str, name: str, mode: str, concurrency: int, duration_s: float) -> dict[str, Any]:
        """One wrk run against target `name` at `url` (the upstream's CPU and the proxy's counted)."""
        pids = {"upstream": self.up.pid} | ({"proxy": self.procs[name].pid} if name in self.procs else {})
        kw: dict[str, Any] = {"pids": pids, "cpu": self.load_cpu, "api_key": self.keys.get(name, "sk-bench")}
        return run_wrk(
            f"{url}/v1/chat/completions",
            self.bodies[mode],
            self.lua,
            concurrency=concurrency,
            duration_s=duration_s,
            **kw,
        )


def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    wrk_path()
    levels = [int(x) for x in args.concurrency.split(",") if x.strip()]
    modes = [m for m in args.modes.split(",") if m]
    wanted = [t for t in args.targets.split(",") if t]
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as tmp_s, contextlib.ExitStack() as stack:
        rig = _Rig(args, pathlib.Path(tmp_s), stack)
        traced_url = receiver_url = None
        if "gateway" in wanted:
            rig.urls["gateway"] = rig.start_gateway("gateway")
            if not args.skip_tracing:
                traced_url, receiver_url = rig.start_tracing()
        rig.start_peers(wanted, notes)
        for name, url in rig.urls.items():
            check_target(f"{url}/v1/chat/completions", rig.keys.get(name, "sk-bench"), args.tokens)
        rows, pairs = run_rounds(rig, levels, modes, traced_url)
        stages: dict[str, Any] = {}
        if args.stages and "gateway" in rig.urls:
            stages = run_stages(rig)
        tracing = tracing_result(pairs, receiver_url) if pairs and receiver_url is not None else {}
        stall: dict[str, Any] = {}
        if not args.skip_stall and "gateway" in rig.urls:
            stall = run_stall(rig)
        long = run_long(rig) if rig.long_cfg is not None else {}
    out = report(args, summarize(rows), stall, notes, levels, modes)
    if stages:
        out["stages_c32"] = stages
    if long:
        out.update(long)
        out["targets"] = {**out["targets"], _long_stream.TARGET_KEY: _long_stream.TARGET}
    if tracing:
        out["tracing_overhead_cpu"] = tracing.pop("tracing_overhead_cpu")
        out["tracing_detail"] = {"level": _tracing.LEVEL, "mode": _tracing.MODE, **tracing}
        out["targets"] = {**out["targets"], "tracing_overhead_cpu": _tracing.TARGET}
    return out


def run_rounds(
    rig: _Rig, levels: list[int], modes: list[str], traced_url: str | None
) -> tuple[list[dict[str, Any]], list[tuple[dict[str, Any], dict[str, Any]]]]:
    """`--rounds` rounds of every mode, level and target (wrk rows), and in
    each the tracing case's pairs (untraced and traced back to back)."""
    args = rig.args
    tracing_urls = {_tracing.OFF: rig.urls.get("gateway", ""), _tracing.ON: traced_url or ""}

    def run_traced(name: str, concurrency: int, duration_s: float) -> dict[str, Any]:
        return rig.wrk(tracing_urls[name], name, _tracing.MODE, concurrency, duration_s)

    rows: list[dict[str, Any]] = []
    pairs: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for rnd in range(args.rounds):
        for mode in modes:
            for c in levels:
                for name, url in rig.urls.items():
                    if rnd == 0:  # warm connections and caches
                        rig.wrk(url, name, mode, min(c, 8), 1)
                    row = rig.wrk(url, name, mode, c, args.duration)
                    row.update(target=name, mode=mode, c=c, round=rnd)
                    rows.append(row)
                    if not args.json:
                        print(json.dumps(row), file=sys.stderr, flush=True)
        if traced_url is not None:
            if rnd == 0:
                _tracing.warm_up(run_traced)
            for pair in _tracing.run_pairs(run_traced, rnd, args.duration):
                pairs.append(pair)
                if not args.json:
                    print(json.dumps({"tracing_pair": pair}), file=sys.stderr, flush=True)
    return rows, pairs


def tracing_result(pairs: list[tuple[dict[str, Any], dict[str, Any]]], receiver_url: str) -> dict[str, Any]:
    """`tracing_overhead_cpu`, the receiver's completeness and each pair's CPU a request."""
    cpu = {
        name: [p[i].get("cpu_us_per_request", {}).get("proxy") for p in pairs] for i, name in enumerate(("off", "on"))
    }
    return {
        "tracing_overhead_cpu": _tracing.overhead(pairs),
        **_tracing.completeness(receiver_url),
        "cpu_us_per_request": cpu,
    }


def run_long(rig: _Rig) -> dict[str, Any]:
    """The long-stream case through every proxy (`bench._long_stream`)."""
    assert rig.long_cfg is not None
    proxies = {n: (rig.urls[n], rig.procs[n].pid, rig.keys.get(n, "sk-bench")) for n in rig.urls if n in rig.procs}
    return _long_stream.run_targets(
        proxies,
        cfg=rig.long_cfg,
        body=_long_stream.chat_stream_body(MODEL, MESSAGES, rig.long_cfg.tokens),
        upstream_pid=rig.up.pid,
        cpu=rig.load_cpu,
        rounds=rig.args.long_rounds,
        log=not rig.args.json,
    )


def run_stages(rig: _Rig) -> dict[str, Any]:
    """The stages case: a gateway of its own with `bench._stages` installed,
    one streamed run at 32."""
    out = rig.tmp / "stages.json"
    url = rig.start_gateway(_stages.NAME, env={_stages.ENV: str(out)})
    return _stages.run_case(
        lambda: rig.wrk(url, _stages.NAME, "stream", 32, rig.args.duration), rig.procs[_stages.NAME].pid, out
    )


def run_stall(rig: _Rig) -> dict[str, Any]:
    args, urls, keys = rig.args, rig.urls, rig.keys
    small = chat_body(stream=True, tokens=args.tokens)
    big = chat_body(stream=True, tokens=args.tokens, content=big_prompt(int(args.big_mb * 1e6)))
    port = int(urls["gateway"].rsplit(":", 1)[1])

    def case(url_port: int, key: str, big_body: bytes | None, window_s: float = 3.0, health: str = "/healthz") -> Any:
        return asyncio.run(
            stall_case(
                "127.0.0.1",
                url_port,
                small_body=small,
                big_body=big_body,
                api_key=key,
                window_s=window_s,
                health_path=health,
            )
        )

    out: dict[str, Any] = {"prompt_bytes": len(big)}
    out["stall"] = case(port, keys["gateway"], big)
    window = out["stall"]["big"]["latency_ms"] / 1000
    out["stall_control"] = case(port, keys["gateway"], None, window_s=max(window, 1.0))
    refusing = rig.start_gateway("gateway-limited", max_prompt_tokens=8192)
    out["stall_refused"] = case(int(refusing.rsplit(":", 1)[1]), keys["gateway-limited"], big)
    for name in PEERS:
        if name in urls:
            peer = case(int(urls[name].rsplit(":", 1)[1]), "sk-bench", big, health="/health")
            out.setdefault("peers", {})[name] = {"stall_ms": peer["stall_ms"], "big": peer["big"]}
    return out


def report(
    args: argparse.Namespace,
    summary: dict[str, Any],
    stall: dict[str, Any],
    notes: list[str],
    levels: list[int],
    modes: list[str],
) -> dict[str, Any]:
    main_mode = "stream" if "stream" in modes else modes[0]
    out: dict[str, Any] = {"tokens_per_request": args.tokens, "concurrency": levels, "cpus": os.cpu_count()}
    out["load_generator"] = "wrk"
    ours = headline(summary, "gateway", main_mode) if "gateway" in summary else {}
    out.update({k: v for k, v in ours.items() if k != "cpu_us_per_request"})
    out["ratio_vs_peers_c32"] = {
        name: round(ours["rps_c32"] / summary[name][main_mode]["32"]["rps"], 3)
        for name in PEERS
        if name in summary and ours.get("rps_c32") and "32" in summary[name].get(main_mode, {})
    }
    out["peers"] = {name: headline(summary, name, main_mode) for name in PEERS if name in summary}
    if stall:
        out["stall_ms"] = stall["stall"]["stall_ms"]
        out["stall_control_ms"] = stall["stall_control"]["stall_ms"]
        out["stall_refused_ms"] = stall["stall_refused"]["stall_ms"]
        out["stall_detail"] = stall
    out["cpu_us_per_request"] = {
        t: {m: {c: v["proxy_cpu_us"] for c, v in by_c.items()} for m, by_c in by_mode.items()}
        for t, by_mode in summary.items()
        if t != "direct"
    }
    out["by_mode"] = {
        m: {t: headline(summary, t, m) for t in summary if t != "direct"} for m in modes if m in summary["direct"]
    }
    out["levels"] = summary
    out["targets"] = TARGETS_TEXT
    out["notes"] = notes
    return out


if __name__ == "__main__":
    raise SystemExit(main())
