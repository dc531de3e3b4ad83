"""A live admin API for the console tests (AppTest and browser).

Real FastAPI app from the admin router, real SQLite store (file in a temp
dir, schema from the table models), a `FakeClusterControl` standing in for
the cluster runtime, served by uvicorn on a free localhost port in a
background thread. Shared by tests/integration/test_console_apptest.py and
tests/e2e/test_console_browser.py.
"""

from __future__ import annotations

import contextlib
import pathlib
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field, replace

import uvicorn
from fastapi import FastAPI

from core import Phase
from gateway.admin import build_admin_router, install_error_handlers
from gateway.control.ports import ClusterSnapshot, NodeSnapshot, PlannerState, SplitSample
from gateway.kv.views import BranchSummary, DirectoryStatus
from gateway.store import Database, EventSink, SinkConfig, repository
from gateway.store.records import SwitchOutcome, UsageRecord
from gateway.store.tables import Base
from planner.types import Decision, PlannerMode, SplitPrediction, SwitchAction


@dataclass
class FakeClusterControl:
    """In-memory `ClusterControl` + `ClusterHistory`: switches are instant and always succeed.

    `draining` marks nodes as draining towards a phase (for the picture);
    pins are realised at once by flipping nodes, as the real runtime would
    by switching them.
    """

    nodes: dict[str, NodeSnapshot] = field(default_factory=dict)
    mode: str = "auto"
    split_pin: int | None = None
    switches: list[SwitchOutcome] = field(default_factory=list)
    directory: DirectoryStatus = field(
        default_factory=lambda: DirectoryStatus(
            blocks=18432, bytes=18432 * 2 * 1024 * 1024, referenced=7020, branches=6, hit_rate=0.63
        )
    )

    @classmethod
    def with_nodes(
        cls,
        prefill: int = 2,
        decode: int = 2,
        *,
        draining: dict[str, str] | None = None,
    ) -> FakeClusterControl:
        fake = cls()
        for i in range(prefill + decode):
            node_id = f"node-{i}"
            phase = "prefill" if i < prefill else "decode"
            fake.nodes[node_id] = NodeSnapshot(
                node_id=node_id,
                url=f"http://127.0.0.1:{9100 + i}",
                phase=Phase(phase),
                draining_to=Phase(to) if (to := (draining or {}).get(node_id)) else None,
                healthy=True,
                pinned_phase=None,
                queue=3 * i % 7,
                running=2 + i,
                kv_usage=round(0.15 + 0.2 * i, 2) % 1.0,
                tokens_per_s=120.0 + 35.5 * i,
            )
        return fake

    def split(self) -> tuple[int, int]:
        prefill = sum(1 for n in self.nodes.values() if n.phase == "prefill")
        return prefill, len(self.nodes) - prefill

    async def snapshot(self) -> ClusterSnapshot:
        return ClusterSnapshot(
            nodes=list(self.nodes.values()),
            split=self.split(),
            split_pin=self.split_pin,
            directory=self.directory,
            top_branches=[
                BranchSummary(branch_id=f"br-{k}", tenant_id="acme" if k % 2 else "globex", blocks=900 - 110 * k)
                for k in range(6)
            ],
        )

    async def planner_state(self) -> PlannerState:
        total = len(self.nodes)
        preds = tuple(
            SplitPrediction(
                prefill_nodes=p,
                decode_nodes=total - p,
                throughput_rps=2.0 + 1.5 * p * (total - p),
                throughput_lo_rps=1.4 + 1.2 * p * (total - p),
                throughput_hi_rps=2.6 + 1.8 * p * (total - p),
                tokens_per_s=0.0,
                ttft_s=4.0 / p,
                tpot_s=0.05 * p,
                feasible=p > 1,
                switch_cost_s=0.0,
            )
            for p in range(1, total)
        )
        decision = Decision(
            t=time.time() - 30,
            planner="fake-bandit",
            current_split=self.split(),
            chosen_split=self.split(),
            actions=(),
            acted=False,
            reason="gain below threshold",
            predictions=preds,
        )
        # The predictions were made a minute before the last decision, which had no data to predict on.
        return PlannerState(
            mode=PlannerMode(self.mode),
            planner="fake-bandit",
            last_decision=replace(decision, reason="hold: insufficient data", predictions=()),
            predictions=preds,
            predictions_t=decision.t - 60,
        )

    async def set_mode(self, mode: str) -> None:
        self.mode = mode

    async def pin_split(self, prefill_nodes: int | None) -> None:
        self.split_pin = prefill_nodes
        if prefill_nodes is None:
            return
        for i, node_id in enumerate(sorted(self.nodes)):
            want = Phase.PREFILL if i < prefill_nodes else Phase.DECODE
            if self.nodes[node_id].phase != want:
                await self.switch(node_id, want, reason="split pin", who="fake")

    async def pin_node(self, node_id: str, phase: Phase | None) -> None:
        self.nodes[node_id] = replace(self.nodes[node_id], pinned_phase=Phase(phase) if phase else None)
        if phase is not None and self.nodes[node_id].phase != phase:
            await self.switch(node_id, phase, reason="node pin", who="fake")

    async def switch(self, node_id: str, to_phase: Phase, *, reason: str, who: str) -> SwitchOutcome:
        node = self.nodes[node_id]
        if node.phase == to_phase:
            return SwitchOutcome(node_id, node.phase, to_phase, 0.0, 0.0, 0.0, "noop", "already there")
        self.nodes[node_id] = replace(node, phase=Phase(to_phase), draining_to=None)
        outcome = SwitchOutcome(
            node_id,
            node.phase,
            to_phase,
            drain_s=0.4,
            migrate_s=1.1 if node.phase == "decode" else 0.0,
            total_s=1.6,
            outcome="ok",
            detail=reason,
        )
        self.switches.append(outcome)
        return outcome

    async def restore_pins(
        self, split_pin: int | None, node_pins: dict[str, Phase], *, who: str
    ) -> list[SwitchOutcome]:
        self.split_pin = split_pin
        return []

    async def split_history(self, since_s: float) -> list[SplitSample]:
        now = time.time()
        steps = int(since_s // 60)
        return [
            SplitSample(
                t=now - 60 * (steps - k),
                prefill=1 if k < steps // 2 else 2,
                decode=3 if k < steps // 2 else 2,
                tokens_per_s=400 + 40 * (k % 9),
            )
            for k in range(steps + 1)
        ]


def seed_store(db: Database) -> dict[str, str]:
    """Two tenants with keys, usage, decisions and switch events; admin tokens per role."""
    now = time.time()
    with db.session() as s:
        acme = repository.create_tenant(s, name="acme", tenant_id="acme")
        repository.create_tenant(s, name="globex", tenant_id="globex")
        repository.create_api_key(s, tenant_id="acme", name="ci", pepper=db.pepper)
        for k in range(30):
            repository.add_usage(
                s,
                tenant_id=acme.id,
                minute=repository.minute_of(now - 600 * k),
                model="demo",
                requests=5 + k,
                prompt_tokens=4000 + 100 * k,
                cached_tokens=2500,
                completion_tokens=800 + 20 * k,
            )
        for k in range(8):
            t = now - 1800 * (k + 1)
            chosen = (2, 2) if k % 3 else (3, 1)
            repository.add_decision(
                s,
                mode="auto",
                decision=Decision(
                    t=t,
                    planner="fake-bandit",
                    current_split=(2, 2),
                    chosen_split=chosen,
                    acted=k % 3 == 0,
                    actions=(SwitchAction("node-2", Phase.PREFILL),) if k % 3 == 0 else (),
                    confidence=0.9,
                    reason="lower bound of gain clears threshold" if k % 3 == 0 else "gain below threshold",
                    predictions=(SplitPrediction(2, 2, 5.0, 4.0, 6.0, 500.0, 0.8, 0.05, True, 3.0),),
                ),
            )
            if k % 3 == 0:
                repository.add_switch_event(
                    s,
                    t=t + 5,
                    reason="planner",
                    who="planner",
                    outcome=SwitchOutcome("node-2", Phase.DECODE, Phase.PREFILL, 0.5, 1.2, 1.9, "ok"),
                )
        repository.add_switch_event(
            s,
            t=now - 300,
            reason="manual: maintenance",
            who="alice",
            outcome=SwitchOutcome("node-1", Phase.PREFILL, Phase.DECODE, 0.3, 0.0, 0.4, "ok"),
        )
        _, operator = repository.create_admin_token(s, name="alice", role="operator", pepper=db.pepper)
        _, viewer = repository.create_admin_token(s, name="victor", role="viewer", pepper=db.pepper)
    return {"operator": operator, "viewer": viewer}


def build_admin_app(*, control: FakeClusterControl, db: Database, sink: EventSink) -> FastAPI:
    """The admin API as the gateway mounts it, with the sink's writer running."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        sink.start()
        yield
        await sink.stop()

    app = FastAPI(lifespan=lifespan)
    app.include_router(build_admin_router(control=control, db=db, sink=sink))
    install_error_handlers(app)
    return app


@dataclass
class LiveAdminApi:
    url: str
    tokens: dict[str, str]
    control: FakeClusterControl
    db: Database


def _serve(app: FastAPI) -> tuple[uvicorn.Server, threading.Thread, str]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name="admin-api")
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("admin API did not start")
        time.sleep(0.05)
    return server, thread, f"http://127.0.0.1:{port}"


@contextlib.contextmanager
def live_admin_api(tmp_dir: pathlib.Path) -> Iterator[LiveAdminApi]:
    db = Database(f"sqlite:///{tmp_dir / 'console.db'}", pepper="console-test-pepper")
    Base.metadata.create_all(db.engine)
    tokens = seed_store(db)
    control = FakeClusterControl.with_nodes(2, 2, draining={"node-3": "prefill"})
    sink = EventSink(db, config=SinkConfig(flush_interval_s=0.05))
    sink.record_usage(UsageRecord("globex", "demo", 1200, 300, 150))
    server, thread, url = _serve(build_admin_app(control=control, db=db, sink=sink))
    try:
        yield LiveAdminApi(url=url, tokens=tokens, control=control, db=db)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        db.dispose()
