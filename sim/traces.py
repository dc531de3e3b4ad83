"""Trace loaders: files in ../shared/traces -> `Workload` (or text turns).

Formats (see the traces README):
- Mooncake JSONL `{timestamp ms, input_length, output_length, hash_ids[, session_id]}`;
  one hash id = one 512-token block.
- Azure CSV `TIMESTAMP, ContextTokens, GeneratedTokens` (no prefix info).
- Agent text JSONL `{timestamp, session_id, input, output}`; timestamps in µs
  (taubench) or ms (opencode, aider): the unit is inferred from magnitude.
  Tokens are characters / 4 (or a tokenizer's count); block ids are chained
  hashes of the text (`sim.sessions.text_block_hashes`). An empty `output`
  is a turn that only called a tool: one token.
- ServeGen per-client `chunk-*-trace.csv` (rate/cv/distribution per 600 s
  window) and `chunk-*-dataset.json` (length PDFs per 6 h window): sampled.

Loaders read files only; they never write, and return requests sorted by
arrival with ids 0..n-1. Requests of one session are closed-loop turns
(`sim.sessions`: same start time = concurrent). Bad input raises
`sim.trace_rows.TraceError` naming the file and line (nothing is half-read).
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from sim.sessions import RawRow, sessionize, text_block_hashes
from sim.trace_rows import (
    TraceError,
    csv_length,
    existing,
    field_ids,
    field_length,
    field_number,
    field_session,
    field_text,
    read_csv,
    read_jsonl,
)
from sim.workloads import Request, Workload

MOONCAKE_BLOCK_TOKENS = 512
MOONCAKE_KEYS = ("input_length", "output_length", "hash_ids")
TEXT_KEYS = ("input", "output")

__all__ = [
    "MOONCAKE_BLOCK_TOKENS",
    "TextTurn",
    "TraceError",
    "load_agent_text",
    "load_any",
    "load_azure",
    "load_mooncake",
    "load_servegen",
    "timestamp_seconds",
]


def _from_zero(raw: list[RawRow]) -> list[RawRow]:
    t0 = min((r[0] for r in raw), default=0.0)
    return [(t - t0, session, prompt, output, hashes) for t, session, prompt, output, hashes in raw]


def load_mooncake(path: str | Path, *, limit: int | None = None, closed_loop: bool = True) -> Workload:
    """Mooncake JSONL; `session_id` (when present) makes turns closed-loop."""
    path = existing(path)
    raw: list[RawRow] = []
    for line, row in read_jsonl(path, limit):
        if not any(k in row for k in MOONCAKE_KEYS):
            raise TraceError(path, line, "not a Mooncake row (needs timestamp, input_length, output_length)")
        raw.append(
            (
                field_number(path, line, row, "timestamp") / 1000.0,
                field_session(path, line, row),
                field_length(path, line, row, "input_length"),
                field_length(path, line, row, "output_length"),
                field_ids(path, line, row, "hash_ids"),
            )
        )
    return sessionize(_from_zero(raw), path.stem, closed_loop, MOONCAKE_BLOCK_TOKENS)


def load_azure(path: str | Path, *, limit: int | None = None) -> Workload:
    """Azure LLM inference CSV; open loop, no prefix sharing."""
    path = existing(path)
    raw: list[RawRow] = []
    for line, row in read_csv(path, ("TIMESTAMP", "ContextTokens", "GeneratedTokens"), limit):
        stamp = row["TIMESTAMP"].strip()
        try:
            ts = datetime.fromisoformat(stamp[:26]).timestamp()
        except ValueError:
            raise TraceError(path, line, f"column 'TIMESTAMP' is not a date and time: {stamp!r}") from None
        raw.append(
            (ts, None, csv_length(path, line, row, "ContextTokens"), csv_length(path, line, row, "GeneratedTokens"), ())
        )
    return sessionize(_from_zero(raw), path.stem, False, MOONCAKE_BLOCK_TOKENS)


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


def agent_files(path: str | Path) -> tuple[list[Path], list[Path]]:
    """(files with rows, empty files) of an agent-text file or folder of them.
    A folder's empty files are sessions that recorded nothing: skipped, and
    returned so the caller can say so; an empty file named alone is an error."""
    p = existing(path)
    if not p.is_dir():
        return [p], []
    files = sorted(p.glob("*.jsonl"))
    if not files:
        raise TraceError(p, None, "no *.jsonl files in this folder")
    empty = [f for f in files if not f.read_text(encoding="utf-8", errors="replace").strip()]
    full = [f for f in files if f not in empty]
    if not full:
        raise TraceError(p, None, "no requests: every *.jsonl file in this folder is empty")
    return full, empty


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
    Token counts come from `tokenizer` (round(chars / `chars_per_token`)
    without one, at least 1). Block ids: chained hashes of the prompt text.
    """
    if isinstance(paths, (str, Path)):
        files, _ = agent_files(paths)
    else:
        files = [existing(x) for x in paths]
    rows: list[tuple[float, str, str, str]] = []
    for f in files:
        for line, row in read_jsonl(f):
            if not any(k in row for k in TEXT_KEYS):
                raise TraceError(f, line, "not an agent-text row (needs timestamp, input, output)")
            sid = field_session(f, line, row) or ""
            per_call = sid.startswith("chatcmpl-") or not sid
            rows.append(
                (
                    timestamp_seconds(field_number(f, line, row, "timestamp")),
                    f"{f.parent.name}:{f.stem}" if per_call else sid,
                    field_text(f, line, row, "input", allow_empty=False),
                    field_text(f, line, row, "output", allow_empty=True),
                )
            )
    rows.sort(key=lambda r: r[0])
    if limit is not None:
        rows = rows[:limit]

    def count(text: str) -> int:
        if tokenizer is None:
            return max(1, round(len(text) / chars_per_token))
        return max(1, len(tokenizer.encode(text, add_special_tokens=False)))

    t0 = rows[0][0] if rows else 0.0
    raw: list[RawRow] = [(t - t0, sid, count(i), count(o), text_block_hashes(i)) for t, sid, i, o in rows]
    name = files[0].parent.name if files else "agents"
    wl = sessionize(raw, name, True, MOONCAKE_BLOCK_TOKENS)
    # sessionize sorts stably by time; rows are already sorted, so ids line up.
    turns = [TextTurn(r, rows[r.req_id][2], rows[r.req_id][3]) for r in wl.requests]
    return wl, turns


def _pdf(path: Path, text: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        d = ast.literal_eval(text)
        values = np.array(list(d.keys()), dtype=float)
        probs = np.array(list(d.values()), dtype=float)
    except (ValueError, SyntaxError, AttributeError, TypeError):
        raise TraceError(path, None, "a length distribution is not a {value: probability} map") from None
    if not len(values) or probs.sum() <= 0 or (probs < 0).any() or (values <= 0).any():
        raise TraceError(path, None, "a length distribution is empty, negative or has lengths <= 0")
    return values, probs / probs.sum()


def _servegen_dataset(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise TraceError(path, e.lineno, f"not valid JSON ({e.msg})") from None
    if not isinstance(data, dict) or not data:
        raise TraceError(path, None, "expected a non-empty {window start: distributions} object")
    for key, window in data.items():
        if not key.lstrip("-").isdigit() or not isinstance(window, dict):
            raise TraceError(path, None, f"window {key!r}: expected an integer start and an object")
        for name in ("input_tokens", "output_tokens"):
            if not isinstance(window.get(name), str):
                raise TraceError(path, None, f"window {key!r}: missing field {name!r}")
    return data


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
    folder = existing(folder)
    rng = np.random.default_rng(seed)
    ids = sorted(int(p.name.split("-")[1]) for p in folder.glob("chunk-*-trace.csv") if p.name.split("-")[1].isdigit())
    if not ids:
        raise TraceError(folder, None, "no chunk-<n>-trace.csv files in this folder")
    if clients is not None:
        ids = [c for c in ids if c in set(clients)]
    raw: list[RawRow] = []
    for c in ids:
        ds_path = folder / f"chunk-{c}-dataset.json"
        if not ds_path.exists():
            continue
        dataset = _servegen_dataset(ds_path)
        pdfs: dict[int, tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]] = {}
        trace = folder / f"chunk-{c}-trace.csv"
        for _line, row in _servegen_rows(trace):
            w0, rate, cv = row[0], row[1] * rate_scale, row[2]
            lo, hi = max(w0, start_s), min(w0 + 600.0, start_s + duration_s)
            if rate <= 0 or lo >= hi:
                continue
            win = max((int(k) for k in dataset if int(k) <= w0), default=min(int(k) for k in dataset))
            if win not in pdfs:
                pdfs[win] = (
                    _pdf(ds_path, dataset[str(win)]["input_tokens"]),
                    _pdf(ds_path, dataset[str(win)]["output_tokens"]),
                )
            ins, outs = pdfs[win]
            shape = 1.0 / max(cv, 0.05) ** 2
            t = w0 + float(rng.uniform(0, 1.0 / rate))
            while t < w0 + 600.0:
                if lo <= t < hi:
                    raw.append(
                        (t - start_s, None, int(rng.choice(ins[0], p=ins[1])), int(rng.choice(outs[0], p=outs[1])), ())
                    )
                t += float(rng.gamma(shape, 1.0 / (rate * shape)))
    return sessionize(raw, "servegen-r1", False, MOONCAKE_BLOCK_TOKENS)


def _servegen_rows(path: Path) -> Iterator[tuple[int, tuple[float, float, float]]]:
    """(line, (window start, rate, cv)) of a ServeGen client trace CSV (no header)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise TraceError(path, None, f"cannot open: {e.strerror or e}") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        cells = line.split(",")
        try:
            w0, rate = float(cells[0]), float(cells[1])
            cv = float(cells[2]) if len(cells) > 2 and cells[2].strip() else 0.0
        except (ValueError, IndexError):
            raise TraceError(path, number, "expected window start, rate, cv as numbers") from None
        if rate < 0 or cv < 0 or not all(np.isfinite((w0, rate, cv))):
            raise TraceError(path, number, f"rate and cv must be finite and >= 0, got {rate}, {cv}")
        yield number, (w0, rate, cv)


def trace_format(path: str | Path) -> str:
    """'servegen', 'azure', 'mooncake' or 'agent-text' (TraceError otherwise):
    a folder of ServeGen chunks or of agent-text files, a .csv, or a JSONL
    file by the fields of its first row."""
    p = existing(path)
    if p.is_dir():
        if any(p.glob("chunk-*-trace.csv")):
            return "servegen"
        files, _ = agent_files(p)
        return trace_format(files[0])
    if p.suffix == ".csv":
        return "azure"
    line, first = next(read_jsonl(p, 1))
    if any(k in first for k in MOONCAKE_KEYS):
        return "mooncake"
    if any(k in first for k in TEXT_KEYS):
        return "agent-text"
    raise TraceError(
        p,
        line,
        "neither a Mooncake row (timestamp, input_length, output_length) nor agent text (timestamp, input, output)",
    )


def load_any(path: str | Path, **kw: Any) -> Workload:
    """Dispatch on `trace_format`; a folder's empty agent files are named in
    `Workload.notes`. kw: seed (ServeGen), limit, tokenizer (agent text)."""
    kind = trace_format(path)
    if kind == "servegen":
        return load_servegen(path, seed=kw.get("seed", 0))
    if kind == "azure":
        return load_azure(path, limit=kw.get("limit"))
    if kind == "mooncake":
        return load_mooncake(path, limit=kw.get("limit"))
    wl = load_agent_text(path, kw.get("tokenizer"), limit=kw.get("limit"))[0]
    empty = agent_files(path)[1]
    return replace(wl, notes=tuple(f"skipped empty file {f.name}" for f in empty)) if empty else wl
