"""A watchdog restart lands in the switch history and the audit log (SQLite store)."""

from __future__ import annotations

import asyncio
import pathlib

from cli.up import record_restart
from cli.watchdog import RestartEvent
from gateway.compose import ControlPlane
from gateway.settings import GatewaySettings
from gateway.store import repository


def test_restart_and_giving_up_are_recorded(tmp_path: pathlib.Path):
    settings = GatewaySettings(data_dir=str(tmp_path))
    cp = ControlPlane.build(settings)
    try:
        record_restart(cp, RestartEvent("w1", "engine core died", "prefill", 1, 1.0))
        record_restart(cp, RestartEvent("w1", "process exited with status -9", "prefill", 5, 0.0, gave_up=True))
        record_restart(cp, RestartEvent("w2", "engine core died", "decode", 1, 0.0, in_place=True))
        assert asyncio.run(cp.sink.flush_all())
        switches, n = cp.db.run(lambda s: repository.list_switch_events(s, node_id="w1"))
        assert n == 2
        in_place, _ = cp.db.run(lambda s: repository.list_switch_events(s, node_id="w2"))
        assert [e.detail for e in in_place] == ["engine core died; engine restarted in place, restart 1"]
        restarted = [e for e in switches if e.outcome == "restarted"][0]
        assert (restarted.from_phase, restarted.to_phase, restarted.who) == ("prefill", "prefill", "supervisor")
        assert "engine core died" in restarted.reason and restarted.detail.endswith("process relaunched, restart 1")
        assert [e for e in switches if e.outcome == "failed"][0].detail.endswith("gave up after 5 restarts")
        audit, _ = cp.db.run(lambda s: repository.list_audit(s, actor="system"))
        restarts = [a for a in audit if a.action.startswith("worker.")]
        assert sorted(a.action for a in restarts) == ["worker.restart", "worker.restart", "worker.restart_given_up"]
        assert {a.target for a in restarts} == {"w1", "w2"}
    finally:
        cp.db.dispose()
