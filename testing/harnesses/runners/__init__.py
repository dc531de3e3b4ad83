"""One runner per agent harness: three CLIs from npm (installed by the Makefile
into `.harnesses/`) and three Python SDKs (pyproject's test extra)."""

from __future__ import annotations

import os
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[3]
BIN_DIR = pathlib.Path(os.environ.get("EVOLVING_HARNESS_BIN", str(ROOT / ".harnesses" / "node_modules" / ".bin")))


def cli_path(name: str) -> pathlib.Path:
    """The pinned CLI's entry point; a clear error when `make harnesses` has not run."""
    path = BIN_DIR / name
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: `make harnesses` installs the pinned CLIs")
    return path


def cli_missing(name: str) -> str | None:
    """Why CLI `name` cannot run here (None: it can), for a test to fail or skip on before starting vLLM."""
    path = BIN_DIR / name
    return None if path.exists() else f"{path} is missing: `make harnesses` installs the pinned CLIs from npm"
