"""`up`'s watchdog (cli.watchdog) over real worker processes (the fake
worker app, no vLLM): a worker whose process was killed, or whose engine
died while the process lives, is restarted in the phase it last had; past
the retry limit it is left down and that is reported."""

from __future__ import annotations

import pathlib
import signal
import sys
import time

import httpx

from cli.supervisor import Children
from cli.watchdog import RestartEvent, RestartPolicy, WorkerSpec, WorkerWatchdog
from testing.stacks import free_port


def wait_until(cond, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def answers(url: str, path: str = "/healthz") -> bool:
    try:
        return httpx.get(url + path, timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


def test_watchdog_restarts_killed_process_and_dead_engine(tmp_path: pathlib.Path):
    children = Children()
    specs = []
    for name, phase in (("w0", "decode"), ("w1", "decode")):
        port = free_port()
        argv = [sys.executable, "-m", "testing.fake_worker_app", "--port", str(port), "--node-id", name]
        argv += ["--phase", phase]
        log = tmp_path / f"{name}.log"
        children.start(name, argv, log)
        specs.append(WorkerSpec(name, f"http://127.0.0.1:{port}", argv, log, None, phase))
    events: list[RestartEvent] = []
    dog = WorkerWatchdog(
        children,
        specs,
        policy=RestartPolicy(base_delay_s=0.2, max_restarts=2, window_s=600),
        on_event=events.append,
        interval_s=0.2,
    )
    w0, w1 = specs
    try:
        wait_until(lambda: answers(w0.url) and answers(w1.url))
        dog.start()
        # The planner moved w0 to prefill: a restart must bring it back as prefill.
        r = httpx.post(w0.url + "/internal/phase", json={"phase": "prefill", "deadline_s": 0, "term": 1}, timeout=10)
        assert r.status_code == 200, r.text
        wait_until(lambda: w0.phase == "prefill")
        old = children.get("w0")
        assert old is not None
        old.send_signal(signal.SIGKILL)
        wait_until(lambda: any(e.node_id == "w0" for e in events))
        wait_until(lambda: answers(w0.url))
        assert httpx.get(w0.url + "/internal/phase", timeout=5).json()["phase"] == "prefill"
        assert events[0].cause.startswith("process exited") and events[0].phase == "prefill"

        # The engine dies, the process lives: restarted too, until the limit.
        for attempt in (1, 2):
            httpx.post(w1.url + "/testing/kill_engine", timeout=5)
            wait_until(lambda a=attempt: sum(e.node_id == "w1" for e in events) >= a)
            wait_until(lambda: answers(w1.url))
        httpx.post(w1.url + "/testing/kill_engine", timeout=5)
        wait_until(lambda: any(e.node_id == "w1" and e.gave_up for e in events))
        w1_events = [e for e in events if e.node_id == "w1"]
        assert [e.cause for e in w1_events[:2]] == ["engine core died"] * 2
        assert [e.attempt for e in w1_events] == [1, 2, 2] and w1_events[1].delay_s == 0.4
        time.sleep(1.0)
        assert httpx.get(w1.url + "/healthz", timeout=5).status_code == 503  # left down, not restarted again
    finally:
        dog.stop()
        children.stop(grace_s=5)
