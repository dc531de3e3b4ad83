"""Metric cardinality is bounded: no client can grow the number of series."""

from __future__ import annotations

import random
import re
import string

import httpx

from core import FinishReason, Phase
from gateway.app import create_app, endpoint_label
from gateway.metrics import OTHER, GatewayMetrics
from gateway.serving.jobs import Finished
from gateway.settings import GatewaySettings
from testing.fake_worker import InProcessWorkerClient


def series(text: str, name: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(name + "{")]


def random_path(rng: random.Random) -> str:
    parts = ["".join(rng.choices(string.ascii_letters + string.digits + "-_.", k=rng.randint(1, 12)))]
    parts += ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(1, 6))) for _ in range(rng.randint(0, 3))]
    return rng.choice(["/v1/", "/", "/admin/", "/v1/models/", "/v1/branches/"]) + "/".join(parts)


async def test_a_thousand_random_paths_add_no_series(tokenizer) -> None:
    settings = GatewaySettings(model_name="demo")
    app = create_app(settings, tokenizer=tokenizer, worker_client=InProcessWorkerClient({}))
    rng = random.Random(21)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:

        async def hit(n: int) -> None:
            for _ in range(n):
                method = rng.choice(["GET", "POST", "DELETE"])
                await client.request(method, random_path(rng), content=b"{}")

        await hit(50)  # every kind of answer once
        before = (await client.get("/metrics")).text
        await hit(1000)
        after = (await client.get("/metrics")).text
    grown = sorted(set(series(after, "evolving_requests_total")) - set(series(before, "evolving_requests_total")))
    assert len(series(after, "evolving_requests_total")) == len(series(before, "evolving_requests_total")), grown
    labels = set(re.findall(r'endpoint="([^"]*)"', after))
    assert labels <= {"other", "models", "branch_finish", "chat", "completions"}, labels
    # Counted, not dropped: the totals grew by the 1000 requests to /v1 paths that were answered.
    total = lambda text: sum(float(line.rsplit(" ", 1)[1]) for line in series(text, "evolving_requests_total"))  # noqa: E731
    assert total(after) > total(before)


def test_route_templates_map_to_bounded_endpoint_names() -> None:
    class Route:
        def __init__(self, path: str) -> None:
            self.path = path

    assert endpoint_label(Route("/v1/chat/completions")) == "chat"
    assert endpoint_label(Route("/v1/models/{model_id:path}")) == "models"
    assert endpoint_label(Route("/v1/responses")) == "responses"  # a route added later: its own name
    assert endpoint_label(None) == "other"


def done() -> Finished:
    return Finished(FinishReason.STOP, 3, 0, 2, 0.01, 0.02, Phase.DECODE)


def test_tenant_and_endpoint_labels_are_capped() -> None:
    metrics = GatewayMetrics(max_tenants=5, max_endpoints=3)
    for i in range(200):
        metrics.observe_request(f"tenant-{i}", f"endpoint-{i % 50}", 200)
        metrics.observe_finished(f"tenant-{i}", done())
    text, _ = metrics.render()
    body = text.decode()
    tenants = set(re.findall(r'tenant="([^"]*)"', body))
    endpoints = set(re.findall(r'endpoint="([^"]*)"', body))
    assert tenants == {f"tenant-{i}" for i in range(5)} | {OTHER}
    assert endpoints == {"endpoint-0", "endpoint-1", "endpoint-2", OTHER}
    # Every request is still counted.
    assert sum(float(line.rsplit(" ", 1)[1]) for line in series(body, "evolving_requests_total")) == 200
