"""Checks of an image against the chart containers that run it.

- Every `EVOLVING_*` name the chart sets must be read by the product code in
  the image (a renamed or dropped setting would otherwise be ignored
  silently), and the chart's command must be an executable on the image's PATH.
- The image holds product code only: neither `bench` nor `testing` imports;
  its compiled modules (the C span encoder) import.
- A container the chart marks readOnlyRootFilesystem cannot write its root
  filesystem, and can write every volume the chart mounts writable.
"""

from __future__ import annotations

import json
from typing import Any

from testing import podman
from testing.chart_pods import ContainerRun

PRODUCT_PACKAGES = ("core", "routing", "planner", "sim", "kvpool", "workers", "gateway", "admin_ui", "cli")
# Compiled modules the images build in (Dockerfile, stage `spanwire`): imported, not just found.
NATIVE_MODULES = ("gateway.telemetry._spanwire",)

# Runs inside the image with its own Python: which names no product source
# mentions, whether bench/testing import, and which commands are missing.
_IN_IMAGE = """
import importlib, importlib.util, json, pathlib, shutil, sys
names, commands, packages, native = json.loads(sys.argv[1])
text = []
for pkg in packages:
    spec = importlib.util.find_spec(pkg)
    for root in (spec.submodule_search_locations or []) if spec else []:
        text += [p.read_text(errors="replace") for p in pathlib.Path(root).rglob("*.py")]
blob = "\\n".join(text)


def _imports(module):
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


print(json.dumps({
    "missing_packages": [p for p in packages if importlib.util.find_spec(p) is None],
    "missing_env": [n for n in names if n not in blob],
    "missing_commands": [c for c in commands if shutil.which(c) is None],
    "bench_or_testing": [p for p in ("bench", "testing") if importlib.util.find_spec(p) is not None],
    "missing_native": [m for m in native if not _imports(m)],
}))
"""


def check_image(image: str, runs: list[ContainerRun]) -> dict[str, Any]:
    names = sorted({n for r in runs for n in r.env_names if n.startswith("EVOLVING_")})
    commands = sorted({r.command[0] for r in runs if r.command})
    arg = json.dumps([names, commands, list(PRODUCT_PACKAGES), list(NATIVE_MODULES)])
    proc = podman.podman("run", "--rm", "--network=none", "--entrypoint", "python3", image, "-c", _IN_IMAGE, arg)
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    result["env_checked"] = len(names)
    result["size_mb"] = podman.image_size_mb(image)
    return result


_WRITE = """
import json, sys
out = {}
for path in sys.argv[1:]:
    try:
        with open(path, "w") as f:
            f.write("x")
        out[path] = "written"
    except OSError as exc:
        out[path] = exc.strerror
print(json.dumps(out))
"""


def check_writes(run: ContainerRun) -> dict[str, Any]:
    """Write into / and into every writable chart volume, inside the running container."""
    writable = [m.target for m in run.mounts if not m.read_only]
    paths = ["/root-write-probe", *[f"{t.rstrip('/')}/write-probe" for t in writable]]
    proc = podman.podman("exec", run.container_name, "python3", "-c", _WRITE, *paths)
    result: dict[str, str] = json.loads(proc.stdout.strip().splitlines()[-1])
    user = podman.podman("exec", run.container_name, "id", "-u").stdout.strip()
    root_blocked = result[paths[0]] != "written"
    volumes_ok = all(result[p] == "written" for p in paths[1:])
    expected_uid = run.user.split(":")[0] if run.user else None
    return {
        "root": result[paths[0]],
        "volumes": {p: result[p] for p in paths[1:]},
        "uid": user,
        "ok": volumes_ok and (root_blocked or not run.read_only_root) and expected_uid in (None, user),
    }
