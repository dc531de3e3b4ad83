"""Malformed trace input: one clear error naming the file and the line, for every loader."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sim import traces
from sim.trace_rows import TraceError

GOOD = {"timestamp": 0, "input_length": 1024, "output_length": 10, "hash_ids": [1, 2]}
TEXT: dict[str, Any] = {"timestamp": 1_700_000_000_000, "session_id": "s", "input": "hello there", "output": "hi"}


def _jsonl(tmp_path: Path, rows: list, name: str = "t.jsonl") -> Path:
    p = tmp_path / name
    p.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return p


def _error(path: Path, loader=traces.load_any) -> TraceError:
    with pytest.raises(TraceError) as e:
        loader(path)
    return e.value


@pytest.mark.parametrize(
    ("bad", "line", "says"),
    [
        ('{"timestamp": 5, "input_length": 10', 3, "not valid JSON"),  # a truncated last line
        ("[1, 2, 3]", 3, "expected a JSON object"),
        ({"timestamp": 5, "output_length": 3}, 3, "missing field 'input_length'"),
        ({"timestamp": 5, "input_length": 10, "output_length": None}, 3, "field 'output_length' is null"),
        ({"timestamp": 5, "input_length": -4, "output_length": 3}, 3, "must be > 0, got -4"),
        ({"timestamp": 5, "input_length": 0, "output_length": 3}, 3, "must be > 0, got 0"),
        ({"timestamp": 5, "input_length": 10, "output_length": 0}, 3, "'output_length' must be > 0"),
        ({"timestamp": 5, "input_length": 10.5, "output_length": 3}, 3, "must be an integer"),
        ({"timestamp": 5, "input_length": True, "output_length": 3}, 3, "must be an integer"),
        ({"timestamp": "noon", "input_length": 10, "output_length": 3}, 3, "'timestamp' must be a finite number"),
        ({"input_length": 10, "output_length": 3}, 3, "missing field 'timestamp'"),
        ({"timestamp": 5, "input_length": 10, "output_length": 3, "hash_ids": [1, "x"]}, 3, "list of integers"),
        ({"timestamp": 5, "input": "agent text", "output": ""}, 3, "not a Mooncake row"),
    ],
)
def test_mooncake_bad_row_names_file_and_line(tmp_path: Path, bad, line: int, says: str) -> None:
    p = _jsonl(tmp_path, [GOOD, "", bad])  # line 2 blank: line numbers count every line
    e = _error(p)
    assert (e.path, e.line) == (str(p), line)
    assert says in str(e) and str(e).startswith(f"{p}:{line}: ")


def test_mooncake_first_row_without_input_length_is_not_read_as_agent_text(tmp_path: Path) -> None:
    p = _jsonl(tmp_path, [{"timestamp": 0, "output_length": 5, "hash_ids": [1]}, GOOD])
    e = _error(p)
    assert e.line == 1 and "missing field 'input_length'" in str(e)


def test_a_row_of_neither_format(tmp_path: Path) -> None:
    e = _error(_jsonl(tmp_path, [{"timestamp": 0, "prompt": "x"}]))
    assert e.line == 1 and "neither a Mooncake row" in str(e)


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_empty_file_is_an_error(tmp_path: Path, content: str) -> None:
    p = tmp_path / "empty.jsonl"
    p.write_text(content)
    e = _error(p)
    assert e.path == str(p) and "no requests" in str(e)
    with pytest.raises(TraceError, match="no requests"):
        traces.load_mooncake(p)


def test_missing_path(tmp_path: Path) -> None:
    e = _error(tmp_path / "nope.jsonl")
    assert "no such file or folder" in str(e) and e.line is None


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ({"timestamp": 1, "session_id": "s", "output": "x"}, "missing field 'input'"),
        ({"timestamp": 1, "session_id": "s", "input": "x", "output": None}, "field 'output' is null"),
        ({"timestamp": 1, "session_id": "s", "input": "", "output": "x"}, "zero-length prompt"),
        ({"timestamp": 1, "session_id": "s", "input": 7, "output": "x"}, "must be a string"),
        ({"session_id": "s", "input": "x", "output": "y"}, "missing field 'timestamp'"),
        ({"timestamp": 1, "session_id": "s", "input_length": 3, "output_length": 1}, "not an agent-text row"),
    ],
)
def test_agent_text_bad_row(tmp_path: Path, bad, says: str) -> None:
    p = _jsonl(tmp_path, [TEXT, bad])
    e = _error(p)
    assert (e.path, e.line) == (str(p), 2) and says in str(e)


def test_agent_text_empty_output_is_a_one_token_tool_call(tmp_path: Path) -> None:
    wl = traces.load_any(_jsonl(tmp_path, [TEXT, {**TEXT, "timestamp": TEXT["timestamp"] + 5_000, "output": ""}]))
    assert [r.output_tokens for r in wl.requests] == [1, 1]  # "hi" rounds to 0 tokens: at least 1


def test_agent_folder_skips_empty_files_and_says_so(tmp_path: Path) -> None:
    _jsonl(tmp_path, [TEXT], "a.jsonl")
    (tmp_path / "b.jsonl").write_text("")
    wl = traces.load_any(tmp_path)
    assert len(wl.requests) == 1 and wl.notes == ("skipped empty file b.jsonl",)
    (tmp_path / "a.jsonl").write_text("")
    assert "every *.jsonl file in this folder is empty" in str(_error(tmp_path))


def _csv(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "t.csv"
    p.write_text(body)
    return p


@pytest.mark.parametrize(
    ("body", "line", "says"),
    [
        ("TIMESTAMP,ContextTokens\n2023-11-16 18:17:03.9799600,4808\n", 1, "header lacks column(s) GeneratedTokens"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,10,3\nyesterday,10,3\n", 3, "TIMESTAMP"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,10,0\n", 2, "must be > 0, got 0"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,-1,3\n", 2, "must be > 0, got -1"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,ten,3\n", 2, "must be an integer"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,10\n", 2, "expected 3 columns"),
    ],
)
def test_azure_bad_row(tmp_path: Path, body: str, line: int, says: str) -> None:
    e = _error(_csv(tmp_path, body))
    assert e.line == line and says in str(e)


def test_azure_header_only_is_empty(tmp_path: Path) -> None:
    assert "no data rows" in str(_error(_csv(tmp_path, "TIMESTAMP,ContextTokens,GeneratedTokens\n")))


def test_servegen_bad_rows(tmp_path: Path) -> None:
    (tmp_path / "chunk-1-trace.csv").write_text("0,1.5,0.8\n600,fast,1\n")
    (tmp_path / "chunk-1-dataset.json").write_text(
        json.dumps({"0": {"input_tokens": "{10: 1.0}", "output_tokens": "{5: 1.0}"}})
    )
    e = _error(tmp_path, lambda p: traces.load_servegen(p, seed=0, duration_s=1_200))
    assert e.path == str(tmp_path / "chunk-1-trace.csv") and e.line == 2
    (tmp_path / "chunk-1-trace.csv").write_text("0,1.5,0.8\n")
    (tmp_path / "chunk-1-dataset.json").write_text('{"0": {"input_tokens": "{10: 1.0}"')
    assert "not valid JSON" in str(_error(tmp_path, lambda p: traces.load_servegen(p, seed=0)))
    empty = tmp_path / "none"
    empty.mkdir()
    assert "no chunk-<n>-trace.csv" in str(_error(empty, lambda p: traces.load_servegen(p, seed=0)))
