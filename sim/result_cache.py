"""A folder of finished suite simulations, so a re-run redoes only what changed.

`simulate --suite --suite-cache DIR` stores each simulation's result as
`DIR/<key>.json`. The key hashes what the run is (the case, the planner,
the starting split, seed, simulator settings, the GPU profile's text) and
the source code it depends on: every planner but `evolving` reads only
the simulator, routing, core and the baseline planners, so a change to
the evolving planner re-runs its own simulations and reuses the static
splits and Dynamo-like ones, which are most of a suite. A change to the
simulator changes every key; one to the suite's own orchestration
(which cases, how they are reported) changes none. Files are written whole (rename), so two
processes or a run killed halfway leave no torn entry.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parents[1]
# What a non-evolving planner's run depends on (the evolving planner's runs depend on all of planner/ too).
_SHARED = ("sim", "routing", "core", "kvpool")
# What runs the suite around the simulations (which cases, how reported): never changes one run's result.
_ORCHESTRATION = ("sim/suite.py", "sim/cli.py", "sim/result_cache.py")
_BASELINE = ("planner/baselines.py", "planner/decision.py", "planner/types.py", "planner/registry.py")


@functools.lru_cache(maxsize=2)
def code_fingerprint(evolving: bool) -> str:
    """Hash of the source files a run with (or without) the evolving planner depends on."""
    skip = {_ROOT / f for f in _ORCHESTRATION}
    files = sorted(p for d in _SHARED for p in (_ROOT / d).rglob("*.py") if p not in skip)
    files += sorted((_ROOT / "planner").glob("*.py")) if evolving else [_ROOT / f for f in _BASELINE]
    h = hashlib.sha256()
    for p in files:
        h.update(str(p.relative_to(_ROOT)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def task_key(what: str, planner: str, profile: str) -> str:
    """`what`: a stable text naming the run apart from its planner (repr of its case and settings)."""
    h = hashlib.sha256()
    for part in (what, planner, Path(profile).read_text(), code_fingerprint(planner == "evolving")):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def load(folder: Path, key: str) -> dict[str, Any] | None:
    path = folder / f"{key}.json"
    if not path.is_file():
        return None
    out: dict[str, Any] = json.loads(path.read_text())
    return out


def store(folder: Path, key: str, result: dict[str, Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{key}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(result))
    tmp.replace(folder / f"{key}.json")
