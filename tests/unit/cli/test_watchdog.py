"""The restart rule of `up`'s watchdog (cli.watchdog): backoff, limit, causes."""

from __future__ import annotations

import pytest

from cli.watchdog import RestartBook, RestartPolicy, down_cause, with_phase


def test_backoff_doubles_up_to_the_cap():
    p = RestartPolicy(base_delay_s=1.0, factor=2.0, max_delay_s=5.0)
    assert [p.delay(a) for a in (1, 2, 3, 4, 5)] == [1.0, 2.0, 4.0, 5.0, 5.0]


def test_restarts_stop_at_the_limit_within_the_window():
    book = RestartBook(RestartPolicy(base_delay_s=1.0, max_restarts=2, window_s=100.0))
    assert book.decide(None, 0.0).restart is False  # healthy: nothing to do
    first = book.decide("engine core died", 10.0)
    second = book.decide("engine core died", 20.0)
    assert (first.restart, first.attempt, first.delay_s) == (True, 1, 1.0)
    assert (second.restart, second.attempt, second.delay_s) == (True, 2, 2.0)
    third = book.decide("engine core died", 30.0)
    assert third.restart is False and third.gave_up is True
    assert book.decide("engine core died", 500.0).restart is False  # given up stays given up


def test_old_restarts_leave_the_window():
    book = RestartBook(RestartPolicy(base_delay_s=1.0, max_restarts=2, window_s=100.0))
    book.decide("x", 0.0)
    book.decide("x", 10.0)
    v = book.decide("x", 150.0)  # both earlier ones are older than the window
    assert (v.restart, v.attempt, v.delay_s) == (True, 1, 1.0)


@pytest.mark.parametrize(
    ("code", "status", "kind", "want"),
    [
        (None, 200, "", None),
        (None, None, "", None),  # no answer from a live process: busy, not dead
        (None, 503, "engine_dead", "engine core died"),
        (None, 503, "not_ready", None),
        (-9, None, "", "process exited with status -9"),
        (1, 503, "engine_dead", "process exited with status 1"),
    ],
)
def test_down_cause(code, status, kind, want):
    assert down_cause(code, status, kind) == want


def test_with_phase_rewrites_or_adds():
    argv = ["w", "--phase", "decode", "--port", "1"]
    assert with_phase(argv, "prefill") == ["w", "--phase", "prefill", "--port", "1"]
    assert with_phase(["w"], "decode") == ["w", "--phase", "decode"]


def test_policy_is_validated():
    with pytest.raises(ValueError, match="factor >= 1"):
        RestartPolicy(factor=0.5)
    with pytest.raises(ValueError, match="max_restarts >= 0"):
        RestartPolicy(max_restarts=-1)


def test_in_place_engine_restarts_become_events_once_each():
    import pathlib

    from cli.watchdog import RestartEvent, WorkerSpec, WorkerWatchdog

    events: list[RestartEvent] = []
    spec = WorkerSpec("w1", "http://127.0.0.1:1", ["w"], pathlib.Path("w1.log"), phase="prefill")
    # No children: this test drives the restart decisions only, never a process.
    dog = WorkerWatchdog(children=None, specs=[spec], on_event=events.append)  # type: ignore[arg-type]
    dog._note_in_place(spec, 0, 7)
    dog._note_in_place(spec, 2, 7)  # two restarts since the last look
    dog._note_in_place(spec, 2, 7)
    assert [(e.node_id, e.cause, e.phase, e.attempt, e.in_place) for e in events] == [
        ("w1", "engine core died", "prefill", 1, True),
        ("w1", "engine core died", "prefill", 2, True),
    ]


class _Proc:
    def __init__(self, pid: int) -> None:
        self.pid = pid

    def poll(self) -> int | None:
        return None


class _Children:
    """A process group whose processes stay alive; `proc` is swapped to relaunch."""

    def __init__(self, pid: int) -> None:
        self.proc = _Proc(pid)

    def get(self, name: str) -> _Proc:
        return self.proc


def test_a_relaunched_process_counts_its_in_place_restarts_from_zero():
    import pathlib

    import httpx

    from cli.watchdog import RestartEvent, WorkerSpec, WorkerWatchdog

    restarts = {"n": 2}

    def worker(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/healthz":
            return httpx.Response(200, json={"status": "ok", "engine": "alive", "engine_restarts": restarts["n"]})
        return httpx.Response(200, json={"phase": "decode", "draining_to": None})

    events: list[RestartEvent] = []
    children = _Children(100)
    spec = WorkerSpec("w1", "http://w1", ["w"], pathlib.Path("w1.log"))
    dog = WorkerWatchdog(children, [spec], on_event=events.append)  # type: ignore[arg-type]
    dog._http = httpx.Client(transport=httpx.MockTransport(worker))
    assert dog._look(spec) is None
    assert [e.attempt for e in events] == [1, 2]  # process 100 restarted its engine twice
    children.proc, restarts["n"] = _Proc(200), 1  # relaunched (not by the watchdog); its first in-place restart
    assert dog._look(spec) is None
    dog._look(spec)
    assert [(e.attempt, e.in_place) for e in events] == [(1, True), (2, True), (1, True)]
    assert (spec.pid, spec.engine_restarts) == (200, 1)
