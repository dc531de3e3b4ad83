"""A thin shell over the `podman` CLI for tests/containers and `bench images`.

Every call runs `podman` with CONTAINERS_CONF pointing at images/containers.conf
(runc; no raised ulimits), the settings this project's sandboxed machines
need. Errors carry podman's own stderr.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import time

import httpx

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONTAINERS_CONF = ROOT / "images" / "containers.conf"


class PodmanError(RuntimeError):
    """A podman command failed; the message holds its stderr."""


def available() -> str | None:
    """None when podman can run containers here, else why not."""
    if shutil.which("podman") is None:
        return "podman is not installed (apt-get install podman runc)"
    if os.geteuid() != 0:
        return "podman runs rootful here: needs root"
    return None


def podman(*args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, CONTAINERS_CONF=os.environ.get("CONTAINERS_CONF", str(CONTAINERS_CONF)))
    proc = subprocess.run(["podman", *args], capture_output=True, text=True, env=env, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise PodmanError(f"podman {' '.join(args[:3])}...: rc={proc.returncode}: {proc.stderr.strip()[-2000:]}")
    return proc


def image_exists(image: str) -> bool:
    return podman("image", "exists", image, check=False).returncode == 0


def image_size_mb(image: str) -> int:
    return int(podman("image", "inspect", "--format", "{{.Size}}", image).stdout.strip()) // 1_000_000


def inspect(name: str) -> dict:
    return json.loads(podman("container", "inspect", name).stdout)[0]


def remove(name: str) -> None:
    podman("rm", "-f", "--time", "0", name, check=False)


def logs(name: str, tail: int = 60) -> str:
    proc = podman("logs", "--tail", str(tail), name, check=False)
    return proc.stdout + proc.stderr


def wait_ready(name: str, url: str, timeout_s: float) -> float:
    """Seconds until `url` answers 200 (the chart's readiness probe); raises with the
    container's log tail when it exits or the deadline passes."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        try:
            if httpx.get(url, timeout=3).status_code == 200:
                return time.monotonic() - start
        except httpx.HTTPError:
            pass
        if not inspect(name)["State"]["Running"]:
            raise PodmanError(f"{name} exited before it was ready:\n{logs(name)}")
        time.sleep(1)
    raise PodmanError(f"{name} not ready at {url} after {timeout_s:.0f} s:\n{logs(name)}")


def stop(name: str, grace_s: int) -> tuple[float, int]:
    """SIGTERM, then SIGKILL after `grace_s` (as the kubelet): (seconds, exit code)."""
    start = time.monotonic()
    podman("stop", "--time", str(grace_s), name, timeout=grace_s + 60)
    elapsed = time.monotonic() - start
    return elapsed, int(inspect(name)["State"]["ExitCode"])
