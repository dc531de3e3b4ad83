"""`evolving-infra up` and `evolving-infra gateway`: run the system locally.

`up` starts N worker processes (`evolving-infra worker ...`), waits until
each answers /readyz, then serves the gateway in this process (and the
console as a process when `admin_ui/app.py` exists), with SQLite under the
data folder. Ctrl-C (or SIGTERM) stops the gateway, then every child:
SIGTERM, a grace period, SIGKILL for stragglers.

`gateway.compose.compose_app(settings)` builds the product as one: the control plane
(store, tenant gate, admin API, event sink,
persisted pins/mode), the planner and its live loop, and the gateway app.

Secrets on the console: the first admin token is printed once, on the start
that created it; `up` prints the demo tenant's key (kept in
`<data-dir>/demo-api-key`, mode 600) in its snippet on every start, because
that is the point of a local demo; `gateway` prints no tenant key.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import httpx

from gateway.settings import GatewaySettings

if TYPE_CHECKING:
    from gateway.compose import ControlPlane

SNIPPET = """\
from openai import OpenAI
client = OpenAI(base_url="{url}/v1", api_key="{key}")
r = client.chat.completions.create(model="{model}", messages=[{{"role": "user", "content": "Hello!"}}],
                                   max_tokens=32, extra_headers={{"X-Branch-ID": "my-agent"}})
print(r.choices[0].message.content, r.usage)"""


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
    p.add_argument("--kv-store-gib", type=float, default=0.25)
    p.add_argument("--no-console", action="store_true")
    p.add_argument("--console-port", type=int, default=8501)
    p.add_argument("--ready-timeout", type=float, default=900.0, help="seconds to wait for workers")


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
    return GatewaySettings.from_env(**overrides)


def serve(settings: GatewaySettings, log_level: str, control_plane: ControlPlane | None = None) -> None:
    import uvicorn

    from gateway.compose import compose_app

    # uvicorn picks uvloop and httptools when installed; no access log on the hot path.
    uvicorn.run(
        compose_app(settings, control_plane=control_plane),
        host=settings.host,
        port=settings.port,
        log_level=log_level,
        access_log=False,
        timeout_graceful_shutdown=5,
    )


def run_gateway(args: argparse.Namespace) -> int:
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
    print(admin_token_notice(cp), flush=True)
    if processes != 1:
        from cli import gateway_procs

        print(f"{processes} gateway processes on port {settings.port}", flush=True)
        cp.db.dispose()  # each process opens its own
        return gateway_procs.run(args, settings)
    serve(settings, args.log_level, cp)
    return 0


@dataclass
class Children:
    procs: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)

    def start(self, name: str, argv: list[str], log: pathlib.Path, env: dict[str, str] | None = None) -> None:
        out = open(log, "ab")
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.procs.append((name, proc))

    def dead(self) -> list[str]:
        return [n for n, p in self.procs if p.poll() is not None]

    def stop(self, grace_s: float = 10.0) -> None:
        for _, p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for _, p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def wait_ready(urls: list[str], children: Children, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    pending = set(urls)
    while pending:
        if children.dead():
            raise RuntimeError(f"process exited during startup: {children.dead()} (see the logs)")
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


def run_up(args: argparse.Namespace) -> int:
    from cli.demo_key import DEMO_KEY_FILE, demo_api_key
    from gateway.compose import ControlPlane, admin_token_notice

    if args.workers < 1:
        raise SystemExit("--workers must be >= 1")
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
    api_key = demo_api_key(control_plane, data) or "sk-local"
    children = Children()
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
            children.start(
                f"w{i}",
                [
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
                ],
                data / "logs" / f"worker-w{i}.log",
                env,
            )
        print(f"starting {args.workers} workers ({n_prefill} prefill); logs in {data / 'logs'}", flush=True)
        wait_ready(urls, children, args.ready_timeout)
        gateway_url = f"http://{args.host}:{args.port}"
        console = pathlib.Path(__file__).resolve().parent.parent / "admin_ui" / "app.py"
        if console.exists() and not args.no_console:
            children.start(
                "console",
                [*exe, "console", "--admin-url", f"{gateway_url}/admin", "--port", str(args.console_port)],
                data / "logs" / "console.log",
                env,
            )
            print(f"console:  http://127.0.0.1:{args.console_port}")
        print(f"gateway:  {gateway_url}/v1   (metrics {gateway_url}/metrics, admin API {gateway_url}/admin)")
        print(f"store:    {control_plane.db.url.render_as_string(hide_password=True)}   auth: {settings.auth}")
        print(admin_token_notice(control_plane))
        if settings.auth == "keys":
            print(f"demo tenant API key in {data / DEMO_KEY_FILE}")
        print("try it:\n" + SNIPPET.format(url=gateway_url, key=api_key, model=settings.served_model), flush=True)
        serve(settings, args.log_level, control_plane)
    except KeyboardInterrupt:
        pass
    finally:
        print("stopping...", flush=True)
        children.stop()
    return 0
