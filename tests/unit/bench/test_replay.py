"""Replay client against an in-memory transport: branch headers and closed-loop order."""

from __future__ import annotations

import asyncio

import httpx

from bench import replay
from sim.workloads import Request, Workload


def test_replay_sends_branch_headers_in_dependency_order(monkeypatch) -> None:
    seen: list[dict[str, str]] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append({k: v for k, v in req.headers.items() if k.startswith("x-")})
        return httpx.Response(200, text='data: {"c":1}\n\ndata: [DONE]\n\n')

    real = httpx.AsyncClient
    monkeypatch.setattr(replay.httpx, "AsyncClient", lambda **kw: real(transport=httpx.MockTransport(handler), **kw))
    reqs = (
        Request(0, "s", "s/b0", 0.0, 10, 5, last_in_branch=False),
        Request(1, "s", "s/b1", 0.0, 12, 5, parent_branch_id="s/b0", after=(0,), gap_s=0.0),
    )
    wl = Workload("t", reqs, 1.0)
    res = asyncio.run(
        replay.replay(
            wl, {0: "a", 1: "b"}, base_url="http://gw", speed=1.0, concurrency=4, api_key="k", model="m", progress=False
        )
    )
    assert [r["req_id"] for r in res] == [0, 1]
    assert seen[0] == {"x-session-id": "s", "x-branch-id": "s/b0"}
    assert seen[1] == {
        "x-session-id": "s",
        "x-branch-id": "s/b1",
        "x-parent-branch-id": "s/b0",
        "x-branch-finished": "true",
    }
    assert replay.summarize(res, 1.0)["errors"] == 0
