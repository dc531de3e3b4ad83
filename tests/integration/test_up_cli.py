"""`evolving-infra gateway` as a real process in front of a fake worker process:
it starts, answers /readyz and an authenticated request, and prints no secret
except the first-start admin token line (once, on the start that created it).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from testing.stacks import free_ports
from testing.tiny_tokenizer import write_tiny_tokenizer

ROOT = pathlib.Path(__file__).resolve().parents[2]
PEPPER = "pepper-that-must-never-be-printed"
WORKER = """
import sys, uvicorn
from testing.fake_worker import FakeWorker
from testing.fake_worker_app import create_fake_worker_app
from gateway.serving.tokenize import PromptTokenizer
vocab = PromptTokenizer.from_dir(sys.argv[2]).vocab_size
app = create_fake_worker_app(FakeWorker("w0", token_range=(10, vocab), block_size=32))
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="error")
"""


def wait_ready(url: str, proc: subprocess.Popen[bytes], log: pathlib.Path, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"exited early:\n{log.read_text() if log.exists() else ''}"
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/readyz", timeout=1.0).status_code == 200:
                return
        time.sleep(0.2)
    raise AssertionError(f"{url} not ready:\n{log.read_text() if log.exists() else ''}")


@contextlib.contextmanager
def process(argv: list[str], log: pathlib.Path, env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def env() -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("EVOLVING_")}
    return {**clean, "EVOLVING_SECRET_PEPPER": PEPPER, "EVOLVING_PLANNER_INTERVAL_S": "0.2", "PYTHONPATH": str(ROOT)}


def gateway_argv(port: int, worker: str, tok: pathlib.Path, data: pathlib.Path) -> list[str]:
    exe = shutil.which("evolving-infra", path=str(pathlib.Path(sys.executable).parent))
    base = [exe] if exe else [sys.executable, "-m", "cli.main"]
    return [
        *base,
        "gateway",
        "--worker-urls",
        worker,
        "--model",
        str(tok),
        "--model-name",
        "demo",
        "--port",
        str(port),
        "--data-dir",
        str(data),
        "--log-level",
        "info",
    ]


def test_gateway_command_serves_with_keys_and_prints_only_the_first_token(
    tmp_path: pathlib.Path, env: dict[str, str]
) -> None:
    tok = write_tiny_tokenizer(tmp_path / "tok")
    data = tmp_path / "data"
    wport, gport = free_ports(2)
    worker, gateway = f"http://127.0.0.1:{wport}", f"http://127.0.0.1:{gport}"
    with process([sys.executable, "-c", WORKER, str(wport), str(tok)], tmp_path / "worker.log", env) as wproc:
        wait_ready(worker, wproc, tmp_path / "worker.log")

        log1 = tmp_path / "gateway-1.log"
        with process(gateway_argv(gport, worker, tok, data), log1, env) as g:
            wait_ready(gateway, g, log1)
            text = log1.read_text()
            lines = [ln.strip() for ln in text.splitlines()]
            i = next(n for n, ln in enumerate(lines) if ln.startswith("admin token (operator; shown only this once"))
            token = lines[i + 1]
            assert token.startswith("eia-") and len(token) > 20
            admin = {"Authorization": f"Bearer {token}"}
            with httpx.Client(base_url=gateway, timeout=30) as http:
                assert http.get("/admin/whoami", headers=admin).json() == {"name": "bootstrap", "role": "operator"}
                assert http.post("/admin/tenants", json={"name": "cli", "id": "cli"}, headers=admin).status_code == 201
                key = http.post("/admin/tenants/cli/keys", json={}, headers=admin).json()["secret"]
                body = {"model": "demo", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
                assert http.post("/v1/chat/completions", json=body).status_code == 401
                r = http.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
                assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 5
            time.sleep(0.5)  # let the process log whatever it logs about these requests
        text = log1.read_text()
        assert text.count(token) == 1  # the one intended line
        assert key not in text and key[:12] not in text and PEPPER not in text

        # Second start on the same store: no token printed, the key still works.
        log2 = tmp_path / "gateway-2.log"
        with process(gateway_argv(gport, worker, tok, data), log2, env) as g:
            wait_ready(gateway, g, log2)
            with httpx.Client(base_url=gateway, timeout=30) as http:
                r = http.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
                assert r.status_code == 200
                assert http.get("/admin/whoami", headers=admin).status_code == 200
        text2 = log2.read_text()
        assert token not in text2 and key not in text2 and PEPPER not in text2
        assert "EVOLVING_ADMIN_TOKEN" in text2  # says how to get a token instead
