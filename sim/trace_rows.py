"""Reading trace files row by row, with one clear error per bad row.

Every loader in `sim.traces` goes through here, so a bad file fails the same
way whatever its format: `TraceError` names the file and the 1-based line
(the CSV header is line 1) and says what is wrong, before anything is
simulated. What counts as bad:

- a line that is not one JSON object (a truncated line included);
- a required field missing or null, or of the wrong type (a boolean is not
  a number);
- a token length that is not a positive integer (0 and negative lengths);
- a timestamp that is not a finite number;
- a file with no rows (empty, or only blank lines), a path that does not exist.

`read_jsonl` yields `(line, row)`; `field_*` check one field of a row.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class TraceError(ValueError):
    """A trace file cannot be read as the workload it claims to be."""

    def __init__(self, path: str | Path, line: int | None, message: str) -> None:
        self.path, self.line, self.reason = str(path), line, message
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {message}")


def existing(path: str | Path) -> Path:
    p = Path(path)
    if not p.exists():
        raise TraceError(p, None, "no such file or folder")
    return p


def read_jsonl(path: Path, limit: int | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line; TraceError on a line
    that is not a JSON object, and on a file without any row."""
    rows = 0
    try:
        f = path.open(encoding="utf-8")
    except OSError as e:
        raise TraceError(path, None, f"cannot open: {e.strerror or e}") from None
    with f:
        for number, line in enumerate(f, start=1):
            if limit is not None and rows >= limit:
                return
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise TraceError(path, number, f"not valid JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(row, dict):
                raise TraceError(path, number, f"expected a JSON object, got {type(row).__name__}")
            rows += 1
            yield number, row
    if rows == 0:
        raise TraceError(path, None, "no requests: the file is empty")


def read_csv(path: Path, columns: tuple[str, ...], limit: int | None = None) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number, row) per data row of a CSV whose header has `columns`."""
    try:
        f = path.open(newline="", encoding="utf-8")
    except OSError as e:
        raise TraceError(path, None, f"cannot open: {e.strerror or e}") from None
    with f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        missing = [c for c in columns if c not in header]
        if missing:
            raise TraceError(path, 1, f"header lacks column(s) {', '.join(missing)} (has: {', '.join(header)})")
        rows = 0
        for row in reader:
            if limit is not None and rows >= limit:
                return
            if None in row or any(row.get(c) is None for c in columns):
                raise TraceError(path, reader.line_num, f"expected {len(header)} columns")
            rows += 1
            yield reader.line_num, row
    if rows == 0:
        raise TraceError(path, None, "no requests: the file has no data rows")


def _get(path: Path, line: int, row: dict[str, Any], name: str) -> Any:
    if name not in row:
        raise TraceError(path, line, f"missing field {name!r}")
    value = row[name]
    if value is None:
        raise TraceError(path, line, f"field {name!r} is null")
    return value


def field_length(path: Path, line: int, row: dict[str, Any], name: str) -> int:
    """A token count: a positive integer (an integral float like 12.0 is accepted)."""
    value = _get(path, line, row, name)
    ok = isinstance(value, int) and not isinstance(value, bool)
    if isinstance(value, float) and value.is_integer():
        value, ok = int(value), True
    if not ok:
        raise TraceError(path, line, f"field {name!r} must be an integer, got {value!r}")
    if value <= 0:
        raise TraceError(path, line, f"field {name!r} must be > 0, got {value}")
    return int(value)


def field_number(path: Path, line: int, row: dict[str, Any], name: str) -> float:
    """A finite number (timestamps)."""
    value = _get(path, line, row, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TraceError(path, line, f"field {name!r} must be a finite number, got {value!r}")
    return float(value)


def field_text(path: Path, line: int, row: dict[str, Any], name: str, *, allow_empty: bool) -> str:
    value = _get(path, line, row, name)
    if not isinstance(value, str):
        raise TraceError(path, line, f"field {name!r} must be a string, got {type(value).__name__}")
    if not value and not allow_empty:
        raise TraceError(path, line, f"field {name!r} is empty (zero-length prompt)")
    return value


def field_ids(path: Path, line: int, row: dict[str, Any], name: str) -> tuple[int, ...]:
    """An optional list of integer block ids (absent: none)."""
    if name not in row:
        return ()
    value = _get(path, line, row, name)
    if not isinstance(value, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in value):
        raise TraceError(path, line, f"field {name!r} must be a list of integers")
    return tuple(value)


def field_session(path: Path, line: int, row: dict[str, Any]) -> str | None:
    """The optional ``session_id`` (absent, null or "" = none)."""
    value = row.get("session_id")
    if value is None or value == "":
        return None
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise TraceError(path, line, f"field 'session_id' must be a string, got {value!r}")
    return str(value)


def csv_length(path: Path, line: int, row: dict[str, str], name: str) -> int:
    text = row[name].strip()
    try:
        value = int(text)
    except ValueError:
        raise TraceError(path, line, f"column {name!r} must be an integer, got {text!r}") from None
    if value <= 0:
        raise TraceError(path, line, f"column {name!r} must be > 0, got {value}")
    return value
