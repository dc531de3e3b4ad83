"""`evolving-infra gateway --workers N`: N gateway processes on one host, one port.

One gateway process is one event loop, so one core for tokenizing, routing
and relaying streams. With `--workers N` uvicorn binds the port once and
forks N processes that accept on it (the kernel spreads connections); each
process is a full replica: its own worker registry and heartbeat, and, for
everything they must agree on, the same shared state as replicas on
separate hosts — the store (tenants, keys, policies, overrides, the
planner's leadership lease) and Redis (KV directory, tenant limits, the
overrides bus, the workload stream). One of them leads the planner.

So `--workers N` (N > 1) needs `EVOLVING_DIRECTORY_URL`: without Redis each
process would enforce every tenant limit on its own and keep its own
directory. The parent migrates the store and prints the admin token once,
then supervises the children (uvicorn's `Multiprocess`: a child that dies is
replaced; SIGTERM stops them all, each releasing what it holds).

The children read their settings from the environment (`GatewaySettings.from_env`,
in `gateway.compose.app_from_env`); the parent puts the command line's
values there first, so flags win as they do with one process. Each child
serves as one gateway process does (`gateway.http.server`): uvloop, the
gateway's HTTP protocol, the collector tuned; uvicorn's defaults would
give it none of the request path's server work (an SSE response then
watches for disconnects with a task per stream and sends every token as an
ASGI message).
"""

from __future__ import annotations

import argparse
import math
import os
from typing import TYPE_CHECKING

from gateway.settings import GatewaySettings

if TYPE_CHECKING:
    from fastapi import FastAPI


def child_environment(settings: GatewaySettings) -> dict[str, str]:
    """The EVOLVING_* variables that give each child the parent's settings."""
    env = {
        "EVOLVING_HOST": settings.host,
        "EVOLVING_PORT": str(settings.port),
        "EVOLVING_BLOCK_SIZE": str(settings.block_size),
        "EVOLVING_WORKER_URLS": ",".join(settings.worker_urls),
        "EVOLVING_DATA_DIR": settings.data_dir,
        "EVOLVING_PLANNER_MODE": settings.planner_mode,
    }
    if settings.model_dir:
        env["EVOLVING_MODEL_DIR"] = settings.model_dir
    if settings.model_name:
        env["EVOLVING_MODEL_NAME"] = settings.model_name
    return env


def check(settings: GatewaySettings, processes: int) -> None:
    if processes < 1:
        raise SystemExit("--workers must be >= 1")
    if processes > 1 and not settings.directory_url:
        raise SystemExit(
            "--workers N > 1 needs EVOLVING_DIRECTORY_URL (a Redis URL): the processes share tenant limits, "
            "the KV directory, overrides and the planner's workload through it"
        )
    if processes > 1 and settings.replica_id:
        raise SystemExit("EVOLVING_REPLICA_ID names one process; unset it with --workers N (each is <host>-<pid>)")


def run(args: argparse.Namespace, settings: GatewaySettings) -> int:
    """Serve `settings` with `args.workers` processes (the caller built the control plane once)."""
    import uvicorn

    from gateway.http.server import server_options

    os.environ.update(child_environment(settings))
    uvicorn.run(
        "cli.gateway_procs:child_app",
        factory=True,
        workers=args.workers,
        host=settings.host,
        port=settings.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=math.ceil(settings.drain_s),
        **server_options(),
    )
    return 0


def child_app() -> FastAPI:
    """One child's app (uvicorn's factory, called in the child): built from
    the environment, the process then prepared as one gateway's is
    (`gateway.http.server.prepare_process`)."""
    from gateway.compose import app_from_env
    from gateway.http.server import prepare_process

    app = app_from_env()
    prepare_process()
    return app
