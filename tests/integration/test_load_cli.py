"""`evolving-infra load` as a real process against a gateway over real HTTP
(store-backed keys, fake workers): it replays both kinds of phase from the
shared agent traces, prints one summary per phase, and leaves no branch open."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import time

import httpx
import pytest

from testing.stacks import control_plane_stack

ROOT = pathlib.Path(__file__).resolve().parents[2]
TRACES = ROOT.parent / "shared" / "traces"

pytestmark = pytest.mark.skipif(not (TRACES / "agents").is_dir(), reason=f"no agent traces in {TRACES}")


def test_load_runs_both_phases_with_branch_headers_and_finishes_its_branches(tmp_path: pathlib.Path) -> None:
    with control_plane_stack(tmp_path, token_delay_s=0.002) as stack:
        key = stack.tenant("loadtest")
        key_file = tmp_path / "key"
        key_file.write_text(key + "\n")
        t0 = time.monotonic()
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "cli.main",
                "load",
                "--base-url",
                stack.url,
                "--api-key-file",
                str(key_file),
                "--traces",
                str(TRACES),
                "--tokenizer",
                str(tmp_path / "tok"),  # the stack's tokenizer: prompts sized exactly
                "--phase-s",
                "4",
                "--cycles",
                "1",
                "--max-context",
                "1024",  # the fake workers' context
                "--prefill-prompt",
                "600",
                "--decode-output-mean",
                "24",
                "--decode-output-max",
                "64",
                "--agents-decode",
                "3",
                "--agents-prefill",
                "2",
                "--max-gap-s",
                "0.05",
                "--timeout-s",
                "60",  # a request that hangs fails the phase with its error, not the whole run silently
                "--json",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        phases = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        assert [p["kind"] for p in phases] == ["prefill", "decode"]
        for p in phases:
            assert p["requests"] > 0 and p["errors"] == 0 and p["first_error"] is None, p
            assert p["ttft_p50_s"] is not None and p["output_tokens_per_s"] > 0
        prefill, decode = phases
        # The two kinds differ the way they should: long fresh prompts vs long answers.
        assert (
            450 < prefill["prompt_tokens_mean"] <= 600 and decode["prompt_tokens_mean"] < prefill["prompt_tokens_mean"]
        )
        assert decode["output_tokens_mean"] > prefill["output_tokens_mean"]
        assert decode["cached_fraction"] > 0.3  # tau-bench turns extend the previous turn's context
        assert time.monotonic() - t0 < 120
        # Every branch the load opened was finished: none is still holding blocks.
        cluster = httpx.get(f"{stack.url}/admin/cluster", headers=stack.admin_headers(), timeout=10).json()
        assert [b for b in cluster["top_branches"] if b["tenant_id"] == "loadtest"] == []
        usage = stack.loop.run(stack.runtime.directory.stats())
        assert usage.referenced == 0, usage


def test_load_refuses_bad_phases_and_reports_an_unreachable_gateway(tmp_path: pathlib.Path) -> None:
    bad = subprocess.run(
        [sys.executable, "-m", "cli.main", "load", "--base-url", "http://127.0.0.1:9", "--phases", "prefill,think"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "--phases takes prefill and decode" in bad.stderr
    down = subprocess.run(
        [sys.executable, "-m", "cli.main", "load", "--base-url", "http://127.0.0.1:9", "--traces", str(TRACES)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert down.returncode == 2 and "cannot reach http://127.0.0.1:9" in down.stderr, down.stderr
