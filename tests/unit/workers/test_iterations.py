"""workers.iterations: each record carries the engine core's CPU share, read from a fake /proc tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from core import Phase
from workers.host_speed import HostSpeedMeter
from workers.iterations import CpuShareMeter, IterationLog, engine_pids, share_of


def _proc(root: Path, pid: int, ppid: int, comm: str, threads: dict[int, tuple[int, int]]) -> None:
    """A process in a fake /proc: its stat line and one schedstat per thread (ran ns, waited ns)."""
    (root / str(pid)).mkdir(exist_ok=True)
    (root / str(pid) / "stat").write_text(f"{pid} ({comm}) S {ppid} {pid} {pid} 0 -1\n")
    for tid, (ran, waited) in threads.items():
        (root / str(pid) / "task" / str(tid)).mkdir(parents=True, exist_ok=True)
        (root / str(pid) / "task" / str(tid) / "schedstat").write_text(f"{ran} {waited} 7\n")


def test_share_is_ran_over_ran_plus_waited_between_two_readings() -> None:
    assert share_of((0, 0), (400, 600)) == pytest.approx(0.4)
    assert share_of((400, 600), (900, 600)) == 1.0  # ran 500, waited 0: nothing competed
    assert share_of((900, 600), (900, 600)) == 1.0  # idle: neither ran nor waited
    assert share_of((900, 600), (100, 700)) is None  # a counter went back: other threads


def test_engine_children_of_this_worker_are_found_by_name(tmp_path: Path) -> None:
    _proc(tmp_path, 100, 1, "python", {100: (0, 0)})  # the worker
    _proc(tmp_path, 200, 100, "VLLM::EngineCor", {200: (0, 0)})  # its engine core
    _proc(tmp_path, 300, 999, "VLLM::EngineCor", {300: (0, 0)})  # another worker's engine core
    assert engine_pids(100, tmp_path) == [200]


def test_each_record_carries_the_share_since_the_one_before(tmp_path: Path) -> None:
    _proc(tmp_path, 100, 1, "python", {100: (0, 0)})
    clock = [0.0]
    log = IterationLog(share=CpuShareMeter(parent=100, proc=tmp_path, every_s=0.2, clock=lambda: clock[0]))

    def step(**kw: object) -> float | None:
        clock[0] += 0.25
        fields = {"phase": Phase.DECODE, "batch_size": 1, "uncached_prompt_tokens": 0, "cached_prompt_tokens": 0}
        fields.update(generated_tokens=1, context_tokens=10, elapsed_ms=5.0, t=1.0, **kw)
        return log.append(**fields).cpu_share

    assert step() is None  # no engine core yet
    _proc(tmp_path, 200, 100, "VLLM::EngineCor", {200: (1_000, 0), 201: (0, 0)})
    assert step() is None  # the first reading: nothing to compare with
    _proc(tmp_path, 200, 100, "VLLM::EngineCor", {200: (5_000, 1_000), 201: (1_000, 3_000)})
    assert step() == pytest.approx(5_000 / 9_000)  # threads summed: ran 4,000 + 1,000, waited 1,000 + 3,000
    assert step(cpu_share=0.7) == 0.7  # a share the caller measured is kept
    _proc(tmp_path, 200, 100, "VLLM::EngineCor", {200: (6_000, 1_000), 201: (1_000, 3_000)})
    clock[0] -= 0.35  # the next record comes 0.15 s after the last read: the last span's share, no read
    assert step() == pytest.approx(5_000 / 9_000)
    assert step() == 1.0  # 0.25 s later: read again; ran 1,000 more, waited nothing


def test_each_record_carries_the_host_probe_unless_the_caller_measured_one(tmp_path: Path) -> None:
    costs = iter([500_000, 900_000])  # thread-clock ns before and after the probe
    speed = HostSpeedMeter(every_s=0.0, cpu_ns=lambda: next(costs), work=lambda: None)
    log = IterationLog(share=CpuShareMeter(parent=100, proc=tmp_path), speed=speed)
    fields = {"phase": Phase.DECODE, "batch_size": 1, "uncached_prompt_tokens": 0, "cached_prompt_tokens": 0}
    fields.update(generated_tokens=1, context_tokens=10, elapsed_ms=5.0, t=1.0)
    assert log.append(**fields).host_probe_us == 400.0
    assert log.append(host_probe_us=123.0, **fields).host_probe_us == 123.0
