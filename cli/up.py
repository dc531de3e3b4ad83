"""`evolving-infra up` and `evolving-infra gateway`: run the system locally.

`up` checks that every port it needs is free (a taken one is an error
naming it), starts N worker processes (`evolving-infra worker ...`), waits
until each answers /readyz, starts the console (Streamlit) and waits for
it, then serves the gateway in this process with SQLite under the data
folder; with `--load` it also runs `evolving-infra load` against itself.
Ctrl-C or SIGTERM stops the gateway, then every child's whole process group
(`cli.supervisor`): SIGTERM, a grace period, SIGKILL for stragglers.
A worker restarts its own dead engine core in place (`workers.engine_heal`);
meanwhile a watchdog (`cli.watchdog`) relaunches a worker whose process
exited or that gave up restarting its engine, with backoff and a retry
limit (`--max-restarts`); every restart, in place or not, is a
switch-history entry and an audit-log entry.

`gateway.compose.compose_app(settings)` builds the product as one: the control plane
(store, tenant gate, admin API, event sink,
persisted pins/mode), the planner and its live loop, and the gateway app.

Secrets on the console: the first admin token is printed once, on the start
that created it; `up` prints the demo tenant's key (kept in
`<data-dir>/demo-api-key`, mode 600) in its snippet on every start, after
checking it against the store, because that is the point of a local demo;
`gateway` prints no tenant key.
"""

from __future__ import annotations

import argparse
import math
import os
import pathlib
import signal
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import httpx

from cli.supervisor import Children, PortClaim, PortInUse, check_ports, tail
from cli.watchdog import RestartEvent, RestartPolicy, WorkerSpec, WorkerWatchdog
from gateway.settings import PLANNER_MODES, GatewaySettings

if TYPE_CHECKING:
    from gateway.compose import ControlPlane


def add_gateway_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        default=os.environ.get("EVOLVING_MODEL_DIR", "data/demo-model"),
        help="model folder (tokenizer and chat template)",
    )
    p.add_argument("--model-name", default=None, help="id served on /v1/models (default: folder name)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--block-size", type=int, default=32, help="KV block size, same as the workers'")
    p.add_argument("--worker-urls", default="", help="comma-separated worker base URLs (gateway only)")
    p.add_argument("--log-level", default="warning")
    p.add_argument(
        "--planner-mode",
        choices=PLANNER_MODES,
        default=None,
        help="planner mode at start (default: EVOLVING_PLANNER_MODE, else advisory); an operator's "
        "choice kept in the store wins",
    )
    p.add_argument(
        "--data-dir",
        default=os.environ.get("EVOLVING_DATA_DIR", "data"),
        help="SQLite store, demo key and logs (EVOLVING_DATA_DIR)",
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_gateway_arguments(p)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--prefill", type=int, default=None, help="prefill workers (default: N // 2)")
    p.add_argument("--worker-port", type=int, default=8100, help="first worker port")
    p.add_argument("--kvcache-gib", type=int, default=1)
    p.add_argument("--max-model-len", type=int, default=None, help="workers' context length (default: the model's)")
    p.add_argument(
        "--hf-overrides",
        default=None,
        help="workers' vLLM hf_overrides as JSON (e.g. rope scaling with a larger --max-model-len)",
    )
    p.add_argument("--kv-store-gib", type=float, default=0.25)
    p.add_argument("--no-console", action="store_true")
    p.add_argument("--console-port", type=int, default=8501)
    p.add_argument("--ready-timeout", type=float, default=900.0, help="seconds to wait for workers")
    p.add_argument("--load", action="store_true", help="also run the built-in agent load (`evolving-infra load`)")
    p.add_argument("--load-phase-s", type=float, default=180.0, help="seconds per phase of the built-in load")
    p.add_argument("--traces", default="../shared/traces", help="traces folder for the built-in load")
    p.add_argument(
        "--max-restarts",
        type=int,
        default=5,
        help="restarts of one worker (process exited or engine died) within 10 minutes before `up` "
        "leaves it down; 0: never restart",
    )


def settings_from_args(args: argparse.Namespace, worker_urls: tuple[str, ...]) -> GatewaySettings:
    overrides: dict[str, object] = {
        "model_dir": args.model,
        "host": args.host,
        "port": args.port,
        "block_size": args.block_size,
        "worker_urls": worker_urls,
        "data_dir": args.data_dir,
    }
    if args.model_name:
        overrides["model_name"] = args.model_name
    if getattr(args, "planner_mode", None):
        overrides["planner_mode"] = args.planner_mode
    return GatewaySettings.from_env(None, **overrides)


def serve(
    settings: GatewaySettings,
    log_level: str,
    control_plane: ControlPlane | None = None,
    on_exit: Callable[[], None] | None = None,
) -> None:
    """Serve the composed app until SIGINT/SIGTERM; `on_exit` runs first thing
    when the signal arrives (`up` stops its load there, before the gateway
    stops taking requests)."""
    from gateway.compose import compose_app
    from gateway.http.server import serve_app

    serve_app(
        compose_app(settings, control_plane=control_plane),
        host=settings.host,
        port=settings.port,
        log_level=log_level,
        on_exit=on_exit,
        timeout_graceful_shutdown=math.ceil(settings.drain_s),  # a second Ctrl-C cuts at once
    )


def run_gateway(args: argparse.Namespace) -> int:
    from cli.startup_text import MODE_MEANING
    from gateway.compose import ControlPlane, admin_token_notice

    urls = tuple(u.strip().rstrip("/") for u in args.worker_urls.split(",") if u.strip())
    settings = settings_from_args(args, urls or GatewaySettings.from_env().worker_urls)
    processes = getattr(args, "workers", 1)
    if processes != 1:
        from cli import gateway_procs

        gateway_procs.check(settings, processes)
    cp = ControlPlane.build(settings)
    print(
        f"gateway:  http://{settings.host}:{settings.port}/v1   auth: {settings.auth}   "
        f"store: {cp.db.url.render_as_string(hide_password=True)}",
        flush=True,
    )
    mode = cp.planner_mode
    print(f"planner:  {settings.planner}, mode {mode} ({MODE_MEANING.get(mode, '?')})", flush=True)
    print(admin_token_notice(cp), flush=True)
    if processes != 1:
        from cli import gateway_procs

        print(f"{processes} gateway processes on port {settings.port}", flush=True)
        cp.db.dispose()  # each process opens its own
        return gateway_procs.run(args, settings)
    serve(settings, args.log_level, cp)
    return 0


def wait_ready(urls: list[str], children: Children, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    pending = set(urls)
    while pending:
        dead = children.dead()
        if dead:
            logs = "; ".join(str(children.logs.get(n, "?")) for n in dead)
            raise RuntimeError(f"process exited during startup: {dead} (see {logs})")
        if time.monotonic() > deadline:
            raise RuntimeError(f"workers not ready after {timeout_s:.0f}s: {sorted(pending)}")
        for url in list(pending):
            try:
                if httpx.get(f"{url}/readyz", timeout=2.0).status_code == 200:
                    pending.discard(url)
                    print(f"  worker ready: {url}", flush=True)
            except httpx.HTTPError:
                pass
        time.sleep(1.0)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def port_claims(args: argparse.Namespace) -> list[PortClaim]:
    claims = [PortClaim(args.port, "gateway", "--port", args.host)]
    claims += [PortClaim(args.worker_port + i, f"worker w{i}", "--worker-port") for i in range(args.workers)]
    if not args.no_console:
        claims.append(PortClaim(args.console_port, "console", "--console-port"))
    return claims


def start_console(children: Children, args: argparse.Namespace, gateway_url: str, data: pathlib.Path) -> str | None:
    """Start Streamlit (directly: one process group to stop) and wait until it
    answers; None when it runs, else why it does not (the gateway serves on)."""
    from admin_ui.cli import console_command

    argv, env = console_command(admin_url=gateway_url, port=args.console_port)
    for secret in ("EVOLVING_ADMIN_TOKEN", "EVOLVING_SECRET_PEPPER"):
        env.pop(secret, None)
    log = data / "logs" / "console.log"
    children.start("console", argv, log, env)
    url = f"http://127.0.0.1:{args.console_port}/_stcore/health"
    deadline = time.monotonic() + 120.0
    while time.monotonic() < deadline:
        proc = children.get("console")
        if proc is None or proc.poll() is not None:
            code = None if proc is None else proc.returncode
            return f"the console exited at start (status {code}); {log} ends with:\n{tail(log)}"
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return None
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    children.stop(names=["console"])
    return f"the console did not answer within 120 s and was stopped; see {log}"


def load_argv(args: argparse.Namespace, gateway_url: str, key_file: pathlib.Path | None, model: str) -> list[str]:
    argv = [sys.executable, "-m", "cli.main", "load", "--base-url", gateway_url, "--model", model]
    argv += ["--tokenizer", args.model, "--phase-s", str(args.load_phase_s), "--traces", args.traces]
    argv += ["--wait-ready-s", "120"]
    if key_file is not None:
        argv += ["--api-key-file", str(key_file)]
    return argv


def run_up(args: argparse.Namespace) -> int:
    from cli.demo_key import demo_key
    from cli.startup_text import StartupFacts, startup_text
    from gateway.compose import ControlPlane, admin_token_notice

    if args.workers < 1:
        raise SystemExit("--workers must be >= 1")
    try:
        check_ports(port_claims(args))
    except PortInUse as exc:
        print(f"evolving-infra up: cannot start: {exc}", file=sys.stderr)
        return 2
    data = pathlib.Path(args.data_dir)
    (data / "logs").mkdir(parents=True, exist_ok=True)
    # Children need no control-plane secrets.
    env = {k: v for k, v in os.environ.items() if k not in ("EVOLVING_ADMIN_TOKEN", "EVOLVING_SECRET_PEPPER")}
    exe = [sys.executable, "-m", "cli.main"]
    n_prefill = args.workers // 2 if args.prefill is None else args.prefill
    cpus = os.cpu_count() or 1
    urls = [f"http://127.0.0.1:{args.worker_port + i}" for i in range(args.workers)]
    settings = settings_from_args(args, tuple(urls))
    # The store first: a bad EVOLVING_DB_URL fails now, not after the workers load.
    control_plane = ControlPlane.build(settings)
    key = demo_key(control_plane, data)
    children = Children()
    specs: list[WorkerSpec] = []
    watchdog: WorkerWatchdog | None = None
    status = 0
    # uvicorn re-raises SIGTERM after its shutdown; the default action would
    # end this process before `finally` stops the workers and the console.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        for i in range(args.workers):
            port = args.worker_port + i
            phase = "prefill" if i < n_prefill else "decode"
            cores = (
                f"{(i * cpus) // args.workers}-{max((i * cpus) // args.workers, ((i + 1) * cpus) // args.workers - 1)}"
            )
            argv = [
                *exe,
                "worker",
                "--model",
                args.model,
                "--port",
                str(port),
                "--phase",
                phase,
                "--node-id",
                f"w{i}",
                "--block-size",
                str(args.block_size),
                "--kvcache-gib",
                str(args.kvcache_gib),
                "--kv-store-gib",
                str(args.kv_store_gib),
                "--threads-bind",
                cores,
                "--run-dir",
                str(data / "run"),
                # compact constrained JSON: still JSON for any model, and the random demo
                # model cannot pad a response_format / tool-call value with whitespace forever
                "--json-no-whitespace",
                *(["--max-model-len", str(args.max_model_len)] if args.max_model_len else []),
                *(["--hf-overrides", args.hf_overrides] if args.hf_overrides else []),
            ]
            log_path = data / "logs" / f"worker-w{i}.log"
            children.start(f"w{i}", argv, log_path, env)
            specs.append(WorkerSpec(f"w{i}", urls[i], argv, log_path, env, phase))
        print(f"starting {args.workers} workers ({n_prefill} prefill); logs in {data / 'logs'}", flush=True)
        wait_ready(urls, children, args.ready_timeout)
        if args.max_restarts > 0:
            watchdog = WorkerWatchdog(
                children,
                specs,
                policy=RestartPolicy(max_restarts=args.max_restarts),
                on_event=lambda e: record_restart(control_plane, e),
            )
            watchdog.start()
        gateway_url = f"http://{args.host}:{args.port}"
        console_problem = None if args.no_console else start_console(children, args, gateway_url, data)
        load_text = None
        if args.load and (key.secret is not None or settings.auth != "keys"):
            children.start_attached(
                "load", load_argv(args, gateway_url, key.path if key.secret else None, settings.served_model), env
            )
            load_text = (
                f"agent load running (evolving-infra load, {args.load_phase_s:.0f} s per phase, prefill-heavy "
                "then decode-heavy); Ctrl-C stops everything"
            )
        elif args.load:
            load_text = "NOT STARTED: no valid API key (see demo key above)"
        facts = StartupFacts(
            gateway_url=gateway_url,
            console_url=None if args.no_console or console_problem else f"http://127.0.0.1:{args.console_port}",
            store=control_plane.db.url.render_as_string(hide_password=True),
            auth=settings.auth,
            planner=settings.planner,
            mode=control_plane.planner_mode,
            mode_persisted=control_plane.overrides.planner_mode is not None,
            requested_mode=settings.planner_mode,
            model=settings.served_model,
            key=key.secret,
            key_file=str(key.path),
            key_problem=key.problem,
            console_problem=console_problem,
            load=load_text,
        )
        print(startup_text(facts, admin_token_notice(control_plane)), flush=True)
        # On Ctrl-C/SIGTERM the load stops first: it starts no new turn while the gateway drains.
        serve(settings, args.log_level, control_plane, on_exit=lambda: children.signal("load", signal.SIGTERM))
    except KeyboardInterrupt:
        pass
    except RuntimeError as exc:  # a worker that died or never got ready: said plainly
        print(f"evolving-infra up: {exc}", file=sys.stderr, flush=True)
        status = 1
    finally:
        print("stopping...", flush=True)
        if watchdog is not None:
            watchdog.stop()  # before the children: it must not restart what is being stopped
        children.stop()
    return status


def record_restart(control_plane: ControlPlane, event: RestartEvent) -> None:
    """A restart (or giving up) in the switch history and the audit log."""
    from core import Phase
    from gateway.store.records import SwitchOutcome

    outcome = "failed" if event.gave_up else "restarted"
    phase = Phase(event.phase)  # the watchdog keeps it as the worker's --phase argument
    where = "engine restarted in place" if event.in_place else "process relaunched"
    detail = f"{event.cause}; " + (
        f"gave up after {event.attempt} restarts" if event.gave_up else f"{where}, restart {event.attempt}"
    )
    control_plane.sink.record_switch(
        SwitchOutcome(event.node_id, phase, phase, 0.0, 0.0, event.delay_s, outcome, detail),
        reason=f"worker {outcome}: {event.cause}",
        who="supervisor",
    )
    control_plane.sink.record_audit(
        actor="system",
        actor_id="system",
        action="worker.restart" if not event.gave_up else "worker.restart_given_up",
        target=event.node_id,
        before={"cause": event.cause},
        after={"phase": event.phase, "attempt": event.attempt, "delay_s": event.delay_s, "in_place": event.in_place},
    )
