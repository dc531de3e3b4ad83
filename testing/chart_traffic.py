"""Traffic for the chart's containers: a chat request with branch headers, an
operator pin through the admin API that switches a worker in place, and a
second request across the new split. Used by testing.chart_scenario."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import httpx

from testing import podman
from testing.chart_pods import ContainerRun

if TYPE_CHECKING:
    from testing.chart_scenario import ChartCluster


def _chat(client: httpx.Client, key: str, model: str, branch: str, session: str) -> dict[str, Any]:
    headers = {
        "Authorization": f"Bearer {key}",
        "X-Branch-ID": branch,
        "X-Session-ID": session,
        "X-Branch-Finished": "true",
    }
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Say hello to the containers."}],
        "max_tokens": 8,
        "temperature": 0,
    }
    r = client.post("/v1/chat/completions", json=body, headers=headers, timeout=180)
    out: dict[str, Any] = {"status": r.status_code}
    if r.status_code == 200:
        data = r.json()
        out["completion_tokens"] = data["usage"]["completion_tokens"]
        out["ok"] = isinstance(data["choices"][0]["message"]["content"], str) and out["completion_tokens"] > 0
    else:
        out["ok"] = False
        out["body"] = r.text[:500]
    return out


def _nodes(client: httpx.Client, admin: dict[str, str]) -> dict[str, dict[str, Any]]:
    r = client.get("/admin/cluster", headers=admin, timeout=10)
    r.raise_for_status()
    return {n["node_id"]: n for n in r.json()["nodes"]}


def exercise(cluster: ChartCluster, gateway: ContainerRun, workers: list[ContainerRun]) -> dict[str, Any]:
    admin = {"Authorization": f"Bearer {cluster.admin_token}"}
    out: dict[str, Any] = {"request_ok": False, "switch_ok": False}
    with httpx.Client(base_url=f"http://127.0.0.1:{gateway.ports['http']}") as client:
        tenant = f"containers-{cluster.run_id}"
        client.post("/admin/tenants", json={"name": tenant, "id": tenant}, headers=admin).raise_for_status()
        created = client.post(f"/admin/tenants/{tenant}/keys", json={"name": "containers"}, headers=admin)
        created.raise_for_status()
        key = created.json()["secret"]
        model = client.get("/v1/models", headers={"Authorization": f"Bearer {key}"}).json()["data"][0]["id"]
        first = _chat(client, key, model, f"b-{cluster.run_id}-1", f"s-{cluster.run_id}")
        out["requests"] = [first]

        nodes = _nodes(client, admin)
        # --node-id=$(POD_NAME): the node ids are the StatefulSet's pod names.
        out["node_ids_are_pod_names"] = sorted(nodes) == sorted(w.pod for w in workers)
        by_pod = {w.pod: w for w in workers}
        target = next((n for n in sorted(nodes) if nodes[n]["phase"] == "decode"), None)
        if target is None or target not in by_pod:
            out["switch"] = {"error": f"no decode worker to pin among {nodes}"}
            out["request_ok"] = first["ok"]
            return out
        before = podman.inspect(by_pod[target].container_name)["State"]
        start = time.monotonic()
        pin = client.put(f"/admin/pins/nodes/{target}", json={"phase": "prefill"}, headers=admin, timeout=120)
        phase = nodes[target]["phase"]
        while time.monotonic() - start < 120 and pin.status_code == 200:
            node = _nodes(client, admin)[target]
            phase = node["phase"]
            if phase == "prefill" and node["healthy"]:
                break
            time.sleep(0.5)
        switch_s = time.monotonic() - start
        after = podman.inspect(by_pod[target].container_name)["State"]
        same_process = before["Pid"] == after["Pid"] and before["StartedAt"] == after["StartedAt"] and after["Running"]
        out["switch"] = {
            "node": target,
            "pin_status": pin.status_code,
            "phase": phase,
            "s": round(switch_s, 2),
            "same_process": same_process,
        }
        second = _chat(client, key, model, f"b-{cluster.run_id}-2", f"s-{cluster.run_id}")
        out["requests"].append(second)
        out["switch_ok"] = pin.status_code == 200 and phase == "prefill" and same_process
        out["request_ok"] = first["ok"] and second["ok"]
    return out
