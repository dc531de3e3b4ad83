"""Trace loaders: files in ../shared/traces -> `Workload` (or text turns).

Formats (see the traces README):
- Mooncake JSONL `{timestamp ms, input_length, output_length, hash_ids[, session_id]}`;
  one hash id = one 512-token block.
- Azure CSV `TIMESTAMP, ContextTokens, GeneratedTokens` (no prefix info).
- Agent text JSONL `{timestamp, session_id, input, output}`; timestamps in µs
  (taubench) or ms (opencode, aider): the unit is inferred from magnitude.
- ServeGen per-client `chunk-*-trace.csv` (rate/cv/distribution per 600 s
  window) and `chunk-*-dataset.json` (length PDFs per 6 h window): sampled.

Loaders read files only; they never write, and return requests sorted by
arrival with ids 0..n-1.
"""

from __future__ import annotations

import ast
import csv
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Protocol

import numpy as np

from sim.workloads import NOMINAL_S_PER_OUTPUT_TOKEN, Request, Workload

MOONCAKE_BLOCK_TOKENS = 512


def _rows(path: Path, limit: int | None) -> Iterable[dict]:
    with path.open() as f:
        for i, line in enumerate(f):
            if limit is not None and i >= limit:
                break
            if line.strip():
                yield json.loads(line)


def _sessionize(
    raw: list[tuple[float, str | None, int, int, tuple[int, ...]]], name: str, closed_loop: bool, block_tokens: int
) -> Workload:
    """Rows (arrival_s, session|None, prompt, output, hashes) -> Workload.

    Within a session each request depends on the previous one when
    `closed_loop`; its tool gap is what the trace shows beyond the nominal
    service time of the previous turn.
    """
    order = sorted(range(len(raw)), key=lambda i: (raw[i][0], i))
    reqs: list[Request] = []
    last: dict[str, Request] = {}
    for new_id, i in enumerate(order):
        t, sess, p, o, h = raw[i]
        prev = last.get(sess) if sess else None
        after: tuple[int, ...] = ()
        gap = 0.0
        if closed_loop and prev is not None:
            after = (prev.req_id,)
            gap = max(0.0, t - prev.arrival_s - prev.output_tokens * NOMINAL_S_PER_OUTPUT_TOKEN)
        sid = sess or f"r{new_id}"
        r = Request(
            new_id,
            sid,
            f"{sid}/main" if sess else sid,
            t,
            max(1, p),
            max(1, o),
            h,
            after=after,
            gap_s=gap,
            last_in_branch=True,
            kind=name,
        )
        if prev is not None:
            reqs[prev.req_id] = _not_last(prev)
        reqs.append(r)
        if sess:
            last[sess] = r
    duration = (reqs[-1].arrival_s if reqs else 0.0) + 1.0
    return Workload(name, tuple(reqs), duration, block_tokens, closed_loop=closed_loop)


def _not_last(r: Request) -> Request:
    return Request(
        r.req_id,
        r.session_id,
        r.branch_id,
        r.arrival_s,
        r.prompt_tokens,
        r.output_tokens,
        r.block_hashes,
        r.parent_branch_id,
        r.after,
        r.gap_s,
        False,
        r.kind,
    )


def load_mooncake(path: str | Path, *, limit: int | None = None, closed_loop: bool = True) -> Workload:
    """Mooncake JSONL; `session_id` (when present) makes turns closed-loop."""
    path = Path(path)
    raw = []
    for row in _rows(path, limit):
        raw.append(
            (
                float(row["timestamp"]) / 1000.0,
                row.get("session_id") or None,
                int(row["input_length"]),
                int(row["output_length"]),
                tuple(int(h) for h in row.get("hash_ids", ())),
            )
        )
    t0 = min((r[0] for r in raw), default=0.0)
    raw = [(t - t0, *rest) for t, *rest in raw]
    return _sessionize(raw, path.stem, closed_loop, MOONCAKE_BLOCK_TOKENS)


def load_azure(path: str | Path, *, limit: int | None = None) -> Workload:
    """Azure LLM inference CSV; open loop, no prefix sharing."""
    path = Path(path)
    raw = []
    with path.open() as f:
        for i, row in enumerate(csv.DictReader(f)):
            if limit is not None and i >= limit:
                break
            ts = datetime.fromisoformat(row["TIMESTAMP"].strip()[:26]).timestamp()
            raw.append((ts, None, int(row["ContextTokens"]), int(row["GeneratedTokens"]), ()))
    t0 = min((r[0] for r in raw), default=0.0)
    raw = [(t - t0, *rest) for t, *rest in raw]
    return _sessionize(raw, path.stem, False, MOONCAKE_BLOCK_TOKENS)


def timestamp_seconds(ts: float) -> float:
    """Agent-trace timestamps: µs (> 1e14), ms (> 1e11) or s, to seconds."""
    if ts > 1e14:
        return ts / 1e6
    if ts > 1e11:
        return ts / 1e3
    return ts


class Tokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


@dataclass(frozen=True)
class TextTurn:
    """One agent turn with its text, for live replay through a real tokenizer."""

    request: Request
    prompt: str
    completion: str


def load_agent_text(
    paths: str | Path | Sequence[str | Path],
    tokenizer: Tokenizer | None = None,
    *,
    limit: int | None = None,
    chars_per_token: float = 4.0,
) -> tuple[Workload, list[TextTurn]]:
    """Agent text JSONL file(s) or a folder of them.

    A session is the row's `session_id` when the file has one per run
    (taubench); otherwise the file (opencode, aider rows carry per-call ids).
    Token counts come from `tokenizer` (chars/`chars_per_token` without one).
    Block hashes are left empty: a live gateway hashes the real tokens.
    """
    if isinstance(paths, (str, Path)):
        p = Path(paths)
        files = sorted(p.glob("*.jsonl")) if p.is_dir() else [p]
    else:
        files = [Path(x) for x in paths]
    rows: list[tuple[float, str, str, str]] = []
    for f in files:
        for row in _rows(f, None):
            sid = str(row.get("session_id") or "")
            per_call = sid.startswith("chatcmpl-") or not sid
            rows.append(
                (
                    timestamp_seconds(float(row["timestamp"])),
                    f"{f.parent.name}:{f.stem}" if per_call else sid,
                    str(row.get("input") or ""),
                    str(row.get("output") or ""),
                )
            )
    rows.sort(key=lambda r: r[0])
    if limit is not None:
        rows = rows[:limit]

    def count(text: str) -> int:
        if tokenizer is None:
            return max(1, int(len(text) / chars_per_token))
        return max(1, len(tokenizer.encode(text, add_special_tokens=False)))

    t0 = rows[0][0] if rows else 0.0
    raw = [(t - t0, sid, count(i), count(o), ()) for t, sid, i, o in rows]
    name = files[0].parent.name if files else "agents"
    wl = _sessionize(raw, name, True, MOONCAKE_BLOCK_TOKENS)
    # _sessionize sorts stably by time; rows are already sorted, so ids line up.
    turns = [TextTurn(r, rows[r.req_id][2], rows[r.req_id][3]) for r in wl.requests]
    return wl, turns


def _pdf(text: str) -> tuple[np.ndarray, np.ndarray]:
    d = ast.literal_eval(text)
    values = np.array(list(d.keys()), dtype=float)
    probs = np.array(list(d.values()), dtype=float)
    return values, probs / probs.sum()


def load_servegen(
    folder: str | Path,
    *,
    seed: int,
    duration_s: float = 3_600.0,
    start_s: float = 0.0,
    clients: Sequence[int] | None = None,
    rate_scale: float = 1.0,
) -> Workload:
    """Sample requests from ServeGen per-client distributions.

    For each client, each 600 s window draws inter-arrival times from a gamma
    with the window's rate and coefficient of variation (the trace's own
    distribution parameters are fitted to these two moments), and lengths from
    the client's PDFs for the 6 h window containing it. Open loop.
    """
    folder = Path(folder)
    rng = np.random.default_rng(seed)
    ids = sorted(int(p.name.split("-")[1]) for p in folder.glob("chunk-*-trace.csv"))
    if clients is not None:
        ids = [c for c in ids if c in set(clients)]
    raw = []
    for c in ids:
        ds_path = folder / f"chunk-{c}-dataset.json"
        if not ds_path.exists():
            continue
        dataset = json.loads(ds_path.read_text())
        pdfs: dict[int, tuple] = {}
        with (folder / f"chunk-{c}-trace.csv").open() as f:
            for row in csv.reader(f):
                w0, rate, cv = float(row[0]), float(row[1]) * rate_scale, float(row[2] or 0)
                lo, hi = max(w0, start_s), min(w0 + 600.0, start_s + duration_s)
                if rate <= 0 or lo >= hi:
                    continue
                win = max((int(k) for k in dataset if int(k) <= w0), default=min(int(k) for k in dataset))
                if win not in pdfs:
                    pdfs[win] = (_pdf(dataset[str(win)]["input_tokens"]), _pdf(dataset[str(win)]["output_tokens"]))
                ins, outs = pdfs[win]
                shape = 1.0 / max(cv, 0.05) ** 2
                t = w0 + float(rng.uniform(0, 1.0 / rate))
                while t < w0 + 600.0:
                    if lo <= t < hi:
                        raw.append(
                            (
                                t - start_s,
                                None,
                                int(rng.choice(ins[0], p=ins[1])),
                                int(rng.choice(outs[0], p=outs[1])),
                                (),
                            )
                        )
                    t += float(rng.gamma(shape, 1.0 / (rate * shape)))
    return _sessionize(raw, "servegen-r1", False, MOONCAKE_BLOCK_TOKENS)


def load_any(path: str | Path, **kw) -> Workload:
    """Dispatch on the file: folder of ServeGen chunks, .csv (Azure), .jsonl."""
    p = Path(path)
    if p.is_dir() and any(p.glob("chunk-*-trace.csv")):
        return load_servegen(p, seed=kw.get("seed", 0))
    if p.suffix == ".csv":
        return load_azure(p, limit=kw.get("limit"))
    first = next(iter(_rows(p, 1)), {}) if p.is_file() else {}
    if "input_length" in first:
        return load_mooncake(p, limit=kw.get("limit"))
    return load_agent_text(p, kw.get("tokenizer"), limit=kw.get("limit"))[0]
