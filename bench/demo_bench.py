"""`evolving-infra bench demo --json`: `make demo` under its load, for a bounded time.

Starts `evolving-infra up --planner-mode auto --load` (two vLLM workers on
the demo model, the console, the built-in agent load) on free ports with a
fresh data folder, watches the admin API until the planner has switched a
node (or `--duration-s` passes), renders every console page in headless
Chromium, stops `up` with SIGTERM as a user's Ctrl-C would, and checks what
is left. One JSON object:

- `planner_switches`: switches the planner made (switch events by `planner:*`, outcome ok) — target >= 1;
- `predictions`: splits with a prediction on GET /admin/planner at the end;
- `console_pages_ok`: pages rendered without an exception or error box (of `console_pages`);
- `listeners_after_stop`: ports of the run still listening after `up` exited — target 0;
- `processes_after_stop`: processes still naming the run's data folder;
- and what explains them: time to the first switch, its reason, stored decisions and their
  reasons, the load's per-phase summaries, the start-up and stop times.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

import httpx

from bench._console_pages import PAGES, browser_available, check_pages
from testing.leftovers import left_after_stop
from testing.stacks import free_port

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOKEN_LINE = "admin token (operator; shown only this once"


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports() -> tuple[int, int, int]:
    """(gateway, first of two consecutive worker ports, console), all free now."""
    worker = free_port()
    while not _bindable(worker + 1):
        worker = free_port()
    taken = {worker, worker + 1}
    gateway = free_port()
    while gateway in taken:
        gateway = free_port()
    console = free_port()
    while console in taken | {gateway}:
        console = free_port()
    return gateway, worker, console


def admin_token(log_text: str) -> str | None:
    lines = [ln.strip() for ln in log_text.splitlines()]
    for i, ln in enumerate(lines):
        if ln.startswith(TOKEN_LINE) and i + 1 < len(lines):
            return lines[i + 1]
    return None


def planner_switches(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Switch events the planner made and finished (oldest first)."""
    mine = [s for s in items if str(s.get("who", "")).startswith("planner:") and s.get("outcome") == "ok"]
    return sorted(mine, key=lambda s: s.get("t", 0.0))


def load_phase_lines(log_text: str) -> list[str]:
    return [ln.strip() for ln in log_text.splitlines() if re.match(r"phase \d+ \S+-heavy: ", ln.strip())]


def run(args: argparse.Namespace) -> dict[str, Any]:
    gateway, worker, console = free_ports()
    ports = [gateway, worker, worker + 1, console]
    work = pathlib.Path(tempfile.mkdtemp(prefix="bench-demo-"))
    data = work / "data"
    log = work / "up.log"
    argv = [
        sys.executable,
        "-m",
        "cli.main",
        "up",
        "--model",
        args.model,
        "--data-dir",
        str(data),
        "--port",
        str(gateway),
        "--worker-port",
        str(worker),
        "--console-port",
        str(console),
        "--planner-mode",
        "auto",
        "--load",
        "--load-phase-s",
        str(args.phase_s),
        "--traces",
        args.traces,
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVOLVING_")}
    t0 = time.monotonic()
    with open(log, "wb") as out:
        up = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    report: dict[str, Any] = {"ports": ports, "log": str(log)}
    base = f"http://127.0.0.1:{gateway}"
    try:
        while "try it" not in log.read_text(errors="replace"):
            if up.poll() is not None or time.monotonic() - t0 > args.start_timeout_s:
                raise RuntimeError(f"up did not start (exit {up.poll()}); see {log}")
            time.sleep(1.0)
        report["startup_s"] = round(time.monotonic() - t0, 1)
        token = admin_token(log.read_text(errors="replace"))
        if token is None:
            raise RuntimeError(f"no admin token in {log}")
        headers = {"Authorization": f"Bearer {token}"}
        load_t0 = time.monotonic()
        switches: list[dict[str, Any]] = []
        planner: dict[str, Any] = {}
        with httpx.Client(base_url=base, headers=headers, timeout=15.0) as http:
            while time.monotonic() - load_t0 < args.duration_s:
                time.sleep(5.0)
                if up.poll() is not None:
                    raise RuntimeError(f"up exited during the run (status {up.returncode}); see {log}")
                with contextlib.suppress(httpx.HTTPError):
                    planner = http.get("/admin/planner").json()
                    switches = planner_switches(http.get("/admin/switches", params={"limit": 500}).json()["items"])
                    if switches and "first_switch_after_load_s" not in report:
                        report["first_switch_after_load_s"] = round(time.monotonic() - load_t0, 1)
                    settled = switches and args.until_switch and len(planner.get("predictions") or []) >= 2
                    if (
                        settled
                        and time.monotonic() - load_t0 >= report["first_switch_after_load_s"] + args.after_switch_s
                    ):
                        break
            decisions = http.get("/admin/decisions", params={"limit": 500}).json()
            report["ran_s"] = round(time.monotonic() - load_t0, 1)
            report["predictions"] = len(planner.get("predictions") or [])
            report["planner_switches"] = len(switches)
            report["switches"] = [
                {"node": s["node_id"], "to": s["to_phase"], "reason": s["reason"], "total_s": s.get("total_s")}
                for s in switches
            ]
            report["decisions_stored"] = decisions["total"]
            reasons = collections.Counter(re.sub(r"[\d.]+", "#", d["reason"])[:80] for d in decisions["items"])
            report["decision_reasons_last_500"] = dict(reasons.most_common(6))
            last = planner.get("last_decision") or {}
            report["last_decision"] = {"reason": last.get("reason"), "split": last.get("current_split")}
        why = browser_available()
        if why is None:
            pages = check_pages(
                f"http://127.0.0.1:{console}", token, shots=pathlib.Path(args.shots) if args.shots else None
            )
            report["console_pages_ok"] = sum(1 for p in pages if p.ok)
            report["console_pages"] = len(PAGES)
            bad = {p.page: p.error for p in pages if not p.ok}
            if bad:
                report["console_page_errors"] = bad
        else:
            report["console_pages_ok"] = None
            report["console_pages"] = len(PAGES)
            report["console_check"] = f"not run: {why}"
    finally:
        stop_t0 = time.monotonic()
        if up.poll() is None:
            up.send_signal(signal.SIGTERM)  # what Ctrl-C / a service manager does
        try:
            report["up_exit"] = up.wait(120)
        except subprocess.TimeoutExpired:
            report["up_exit"] = "killed after 120 s"
            os.killpg(up.pid, signal.SIGKILL)
            up.wait()
        report["stop_s"] = round(time.monotonic() - stop_t0, 1)
        time.sleep(1.0)
        left = left_after_stop(ports, data)
        report["listeners_after_stop"] = len(left.listeners)
        report["processes_after_stop"] = len(left.processes)
        text = log.read_text(errors="replace")
        report["load_phases"] = load_phase_lines(text)
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="evolving-infra bench demo", description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print only the JSON object")
    ap.add_argument("--model", default=str(ROOT / "data" / "demo-model"))
    ap.add_argument("--traces", default=str(ROOT.parent / "shared" / "traces"))
    ap.add_argument("--duration-s", type=float, default=600.0, help="longest run under load")
    ap.add_argument("--phase-s", type=float, default=150.0, help="seconds per load phase")
    ap.add_argument(
        "--until-switch",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="stop once the planner has switched (after --after-switch-s)",
    )
    ap.add_argument("--after-switch-s", type=float, default=30.0)
    ap.add_argument("--start-timeout-s", type=float, default=600.0)
    ap.add_argument("--shots", default=None, help="folder for the console screenshots")
    a = ap.parse_args(argv)
    try:
        report = run(a)
    except RuntimeError as exc:
        print(json.dumps({"error": str(exc)}))
        return 1
    print(json.dumps(report) if a.json else json.dumps(report, indent=1))
    ok = (
        report.get("planner_switches", 0) >= 1
        and report.get("listeners_after_stop") == 0
        and report.get("console_pages_ok") in (len(PAGES), None)
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
