"""One wrk run against one URL, with the CPU the servers spent on it.

wrk (Debian's `wrk`, C, one event loop per thread) is the load generator:
its latency histogram has microsecond resolution (hey prints 0.1 ms) and it
costs ~14 µs of CPU per request against hey's ~38 (measured here), so
"direct" reaches 21-50k requests/s and the generator is not what a proxy is
measured by. The Lua script posts one JSON body and prints wrk's summary as
one JSON line.

CPU accounting: `utime + stime` of each named process (all its threads,
from /proc) over the run, divided by the completed requests: a proxy's CPU
per request, far steadier than requests/s on a shared machine. The
machine's busy fraction over the run is reported too, so noisy runs show.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import time
from typing import Any

_HZ = os.sysconf("SC_CLK_TCK")

POST_LUA = r"""
function init(args)
  local fh = io.open(args[1], "rb"); wrk.body = fh:read("*a"); fh:close()
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
  wrk.headers["Authorization"] = "Bearer " .. (args[2] or "sk-bench")
end
done = function(summary, latency, requests)
  io.write(string.format('WRK {"requests":%d,"duration_s":%.3f,"p50_ms":%.3f,"p90_ms":%.3f,"p99_ms":%.3f,'
    .. '"max_ms":%.3f,"mean_ms":%.3f,"non2xx":%d,"errors":%d}\n',
    summary.requests, summary.duration / 1e6, latency:percentile(50) / 1000, latency:percentile(90) / 1000,
    latency:percentile(99) / 1000, latency.max / 1000, latency.mean / 1000, summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout))
end
"""


def wrk_path() -> str:
    path = shutil.which("wrk")
    if path is None:
        raise RuntimeError("wrk is not installed (Debian: apt-get install wrk)")
    return path


def process_cpu_s(pid: int) -> float:
    """utime + stime of `pid`, all threads, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _HZ


def _machine() -> tuple[float, float]:
    with open("/proc/stat") as f:
        values = [int(x) for x in f.readline().split()[1:]]
    return sum(values) / _HZ, (values[3] + values[4]) / _HZ


def run_wrk(
    url: str,
    body: pathlib.Path,
    lua: pathlib.Path,
    *,
    concurrency: int,
    duration_s: float,
    pids: dict[str, int],
    cpu: str | None = None,
    api_key: str = "sk-bench",
) -> dict[str, object]:
    """wrk's summary (requests, rps, p50/p90/p99/max ms, non2xx, errors) plus
    `cpu_us_per_request` per named pid and `machine_busy`."""
    threads = 1 if concurrency < 8 else 2
    cmd = [
        wrk_path(),
        f"-t{threads}",
        f"-c{concurrency}",
        f"-d{max(1, round(duration_s))}s",
        "--timeout",
        "10s",
        "-s",
        str(lua),
        url,
        "--",
        str(body),
        api_key,
    ]
    if cpu is not None:
        cmd = ["taskset", "-c", cpu, *cmd]
    before = {name: process_cpu_s(pid) for name, pid in pids.items()}
    machine0 = _machine()
    t0 = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration_s + 60).stdout
    wall = time.monotonic() - t0
    machine1 = _machine()
    after = {name: process_cpu_s(pid) for name, pid in pids.items()}
    m = re.search(r"^WRK (\{.*\})$", out, re.MULTILINE)
    if m is None:
        return {"error": out[-500:] or "wrk printed nothing"}
    res: dict[str, Any] = json.loads(m.group(1))
    n = max(int(res["requests"]), 1)
    res["rps"] = round(n / float(res["duration_s"]), 1)
    total = machine1[0] - machine0[0]
    res["machine_busy"] = round(1 - (machine1[1] - machine0[1]) / total, 3) if total > 0 else None
    res["cpu_us_per_request"] = {name: round(1e6 * (after[name] - before[name]) / n, 1) for name in pids}
    res["cpu_share"] = {name: round((after[name] - before[name]) / wall, 3) for name in pids}
    return res
