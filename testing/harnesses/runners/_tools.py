"""The one tool the SDK harnesses offer: list the task's folder."""

from __future__ import annotations

import pathlib

INSTRUCTIONS = "You are a helpful assistant working in a folder. Use the list_files tool to see what is in it."
DESCRIPTION = "List the files in the current folder, one name and size in bytes per line."


def list_files(folder: pathlib.Path) -> str:
    return "\n".join(f"{p.name} {p.stat().st_size}" for p in sorted(folder.iterdir()) if p.is_file())
