"""Traffic for the chart's containers: a chat request with branch headers, an
operator pin through the admin API that switches a worker in place, a second
request across the new split, then the other worker pinned to prefill too and
a third request (no decode node left: a prefill node serves it whole). Used by
testing.chart_scenario and testing.chart_host."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import httpx

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


def _states(nodes: dict[str, dict[str, Any]]) -> dict[str, str]:
    """node id -> "phase/health" (what routing sees), for the report."""
    return {n: f"{v['phase']}/{v.get('health', 'healthy' if v['healthy'] else 'unhealthy')}" for n, v in nodes.items()}


def _pin_prefill(client: httpx.Client, admin: dict[str, str], node_id: str) -> tuple[int, str, float]:
    """Pin `node_id` to prefill and wait (120 s) until it serves as prefill:
    (the pin's HTTP status, the phase last seen, seconds)."""
    start = time.monotonic()
    pin = client.put(f"/admin/pins/nodes/{node_id}", json={"phase": "prefill"}, headers=admin, timeout=120)
    phase = ""
    while time.monotonic() - start < 120 and pin.status_code == 200:
        node = _nodes(client, admin)[node_id]
        phase = node["phase"]
        if phase == "prefill" and node["healthy"]:
            break
        time.sleep(0.5)
    return pin.status_code, phase, time.monotonic() - start


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
        out["model"] = model
        first = _chat(client, key, model, f"b-{cluster.run_id}-1", f"s-{cluster.run_id}")
        out["requests"] = [first]

        nodes = _nodes(client, admin)
        # --node-id=$(POD_NAME): the node ids are the StatefulSet's pod names.
        out["node_ids_are_pod_names"] = sorted(nodes) == sorted(w.pod for w in workers)
        out["nodes_before_switch"] = _states(nodes)
        by_pod = {w.pod: w for w in workers}
        target = next((n for n in sorted(nodes) if nodes[n]["phase"] == "decode"), None)
        if target is None or target not in by_pod:
            out["switch"] = {"error": f"no decode worker to pin among {nodes}"}
            out["request_ok"] = first["ok"]
            return out
        before = cluster.process_state(by_pod[target])
        pin_status, phase, switch_s = _pin_prefill(client, admin, target)
        after = cluster.process_state(by_pod[target])
        same_process = before["Pid"] == after["Pid"] and before["StartedAt"] == after["StartedAt"] and after["Running"]
        out["switch"] = {
            "node": target,
            "pin_status": pin_status,
            "phase": phase,
            "s": round(switch_s, 2),
            "same_process": same_process,
        }
        out["nodes_after_switch"] = _states(_nodes(client, admin))
        second = _chat(client, key, model, f"b-{cluster.run_id}-2", f"s-{cluster.run_id}")
        out["requests"].append(second)
        out["switch_ok"] = pin_status == 200 and phase == "prefill" and same_process
        out["request_ok"] = first["ok"] and second["ok"]
        # Every node pinned to prefill: the router gives a prefill node the whole
        # request (no decode node left), and the cluster still serves.
        for other in sorted(n for n in nodes if n != target):
            _pin_prefill(client, admin, other)
        out["nodes_all_prefill"] = _states(_nodes(client, admin))
        out["all_prefill_request"] = _chat(client, key, model, f"b-{cluster.run_id}-3", f"s-{cluster.run_id}")
    return out
