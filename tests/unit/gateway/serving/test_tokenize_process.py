"""ProcessTokenizer: the tokenizer's own process dies with the gateway, even
when the gateway is killed outright (no orphan of hundreds of MB)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap
import time

ROOT = pathlib.Path(__file__).resolve().parents[4]

SCRIPT = textwrap.dedent(
    """
    import asyncio, multiprocessing, os, sys
    from gateway.serving.tokenize_process import ProcessTokenizer

    async def main():
        proc = ProcessTokenizer(sys.argv[1])
        ids = await proc.encode(text="agents call tools " * 20)
        child = multiprocessing.active_children()[0].pid
        print(len(ids), child, flush=True)
        os._exit(0)  # killed outright: no shutdown of the pool

    if __name__ == "__main__":
        asyncio.run(main())
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:  # a zombie waiting for its reaper is gone too
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:  # reaped in between
        return False


def test_the_child_exits_when_the_gateway_dies_without_closing_it(tokenizer_dir: pathlib.Path, tmp_path) -> None:
    script = tmp_path / "gw.py"
    script.write_text(SCRIPT)
    out = subprocess.run(
        [sys.executable, str(script), str(tokenizer_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    n_ids, child = (int(x) for x in out.stdout.split())
    assert n_ids > 0, out.stderr
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(child), "the tokenizer's process outlived the gateway"


async def test_warm_starts_the_child_and_close_stops_it(tokenizer_dir: pathlib.Path) -> None:
    import multiprocessing

    from gateway.serving.tokenize_process import ProcessTokenizer

    before = {p.pid for p in multiprocessing.active_children()}
    proc = ProcessTokenizer(str(tokenizer_dir))
    assert await proc.warm() is True
    (child,) = [p.pid for p in multiprocessing.active_children() if p.pid is not None and p.pid not in before]
    proc.close()
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:  # the OS's view: the executor's thread reaps it
        time.sleep(0.1)
    assert not _alive(child), "close() left the tokenizer's process running"
