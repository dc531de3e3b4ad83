"""The local cluster of `bench chaos`: worker processes, the gateway in a
thread of this process, the store's tenants, and what is left at the end."""

from __future__ import annotations

import asyncio
import os
import pathlib
import threading
import time
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    from bench.chaos_bench import ChaosConfig


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
                    timeout_graceful_shutdown=int(self.graceful_s),
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

    def begin_stop(self) -> None:
        """Stop taking connections; streams still running get `graceful_s`
        to finish (read now: the server's config was built with the value
        at start), then the server cancels them (each ends with a
        `gateway_shutting_down` error event)."""
        if self._server is not None:
            self._server.config.timeout_graceful_shutdown = int(self.graceful_s)
            self._server.should_exit = True

    def listening(self) -> bool:
        return self._server is not None and any(s.is_serving() for s in self._server.servers)

    def join(self) -> None:
        self._thread.join(self.graceful_s + 20)

    def stop(self) -> None:
        self.begin_stop()
        self.join()


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
                # Streams are compared token by token with a reference run: in
                # bfloat16 (what "auto" picks on a CPU with native bf16) greedy
                # argmaxes flip with the batch's composition, which would show
                # as mismatched and "duplicated" tokens that no fault caused.
                "--dtype",
                "float32",
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
        "directory_active_branches_after": stats.branches,
        "directory_referenced_blocks_after": stats.referenced,
        "worker_inflight_after": inflight,
    }
