"""Security promises of issue 10, through the real gateway + control plane
(SQLite store) over fake workers on localhost:

- API keys and admin tokens are stored only as salted hashes and never logged;
- tenant keys never work on the admin API;
- a tenant cannot finish, list or read another tenant's branches, usage or keys;
- cache isolation: the same prompt from two tenants gives the second one no
  cached tokens, unless an operator turns isolation off for both;
- the admin and worker APIs bind to loopback by default; a worker exposed
  beyond loopback refuses to start without a cluster token, and its
  /internal API then requires that token.
"""

from __future__ import annotations

import logging
import pathlib
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest
import sqlalchemy as sa

from gateway.store import credentials
from testing.stacks import MODEL, ControlPlaneStack, assert_openai_error, control_plane_stack

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROMPT = [
    {"role": "system", "content": "You are a careful coding agent working in a large repository."},
    {
        "role": "user",
        "content": "Agents call tools, read their results and continue the conversation "
        "with a cached prefix; prefill computes the prompt.",
    },
]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlaneStack]:
    with control_plane_stack(tmp_path_factory.mktemp("security")) as s:
        yield s


def chat(
    stack: ControlPlaneStack,
    key: str,
    *,
    branch: str | None = None,
    finished: bool = False,
    messages: list[dict[str, str]] | None = None,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    h = {"Authorization": f"Bearer {key}", **(headers or {})}
    if branch:
        h["X-Branch-ID"] = branch
    if finished:
        h["X-Branch-Finished"] = "true"
    return httpx.post(
        f"{stack.url}/v1/chat/completions",
        headers=h,
        timeout=15,
        json={"model": MODEL, "messages": messages or PROMPT, "max_tokens": 4, "temperature": 0},
    )


def dump_database(stack: ControlPlaneStack) -> str:
    """Every cell of every table, as text."""
    out = []
    with stack.db.engine.connect() as conn:
        for name in sa.inspect(conn).get_table_names():
            for row in conn.execute(sa.text(f'SELECT * FROM "{name}"')):
                out.append(f"{name}: " + " | ".join(str(v) for v in row))
    return "\n".join(out)


# -- keys at rest and in logs ----------------------------------------------------
def test_api_keys_hashed_at_rest_and_never_logged(
    stack: ControlPlaneStack, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG)
    op = stack.admin_headers()
    assert (
        httpx.post(
            f"{stack.url}/admin/tenants", json={"name": "sec-a", "id": "sec-a"}, headers=op, timeout=10
        ).status_code
        == 201
    )
    created = httpx.post(f"{stack.url}/admin/tenants/sec-a/keys", json={"name": "ci"}, headers=op, timeout=10).json()
    key = created["secret"]
    token = httpx.post(
        f"{stack.url}/admin/tokens", json={"name": "viewer-1", "role": "viewer"}, headers=op, timeout=10
    ).json()["secret"]
    # Use them, right and wrong, on every surface that sees them.
    assert chat(stack, key).status_code == 200
    assert chat(stack, key[:-2] + "zz").status_code == 401
    assert (
        httpx.get(f"{stack.url}/admin/whoami", headers={"Authorization": f"Bearer {token}"}, timeout=10).status_code
        == 200
    )
    assert (
        httpx.get(f"{stack.url}/admin/whoami", headers={"Authorization": f"Bearer {token}x"}, timeout=10).status_code
        == 401
    )
    assert (
        httpx.get(f"{stack.url}/admin/cluster", headers={"Authorization": f"Bearer {key}"}, timeout=10).status_code
        == 401
    )
    stack.loop.run(stack.sink.flush_all())

    dump = dump_database(stack)
    for secret in (key, token, stack.operator):
        assert secret not in dump
        assert secret[12:] not in dump  # not even the part after the visible prefix
    with stack.db.engine.connect() as conn:
        row = conn.execute(
            sa.text("SELECT prefix, salt, secret_hash FROM api_keys WHERE id = :id"), {"id": created["id"]}
        ).one()
    assert row.prefix == key[:12] and row.secret_hash != key
    assert credentials.verify_secret(key, salt=row.salt, pepper=stack.db.pepper, secret_hash=row.secret_hash)
    # Without the pepper (kept out of the database) the hash cannot be checked.
    assert not credentials.verify_secret(key, salt=row.salt, pepper="", secret_hash=row.secret_hash)

    logged = caplog.text + "".join(capfd.readouterr())
    for secret in (key, token, stack.operator, key[:-2] + "zz"):
        assert secret not in logged and secret[12:] not in logged


def test_tenant_keys_rejected_by_admin_api(stack: ControlPlaneStack) -> None:
    key = stack.tenant("sec-b")
    auth = {"Authorization": f"Bearer {key}"}
    for method, path in [
        ("GET", "/admin/whoami"),
        ("GET", "/admin/cluster"),
        ("GET", "/admin/tenants"),
        ("GET", "/admin/tenants/sec-b"),
        ("GET", "/admin/tenants/sec-b/usage"),
        ("GET", "/admin/tenants/sec-b/keys"),
        ("GET", "/admin/audit"),
        ("GET", "/admin/switches"),
        ("POST", "/admin/switch"),
        ("PUT", "/admin/planner/mode"),
        ("POST", "/admin/tokens"),
        ("DELETE", "/admin/tenants/sec-b"),
    ]:
        r = httpx.request(method, f"{stack.url}{path}", headers=auth, json={}, timeout=10)
        assert r.status_code == 401, (method, path, r.text)
        assert assert_openai_error(r)["type"] == "authentication_error"
    # And an admin token is no tenant key.
    assert chat(stack, stack.operator).status_code == 401


def test_tenant_cannot_touch_another_tenants_branches_usage_or_keys(stack: ControlPlaneStack) -> None:
    key_a, key_b = stack.tenant("iso-a"), stack.tenant("iso-b")
    directory = stack.runtime.directory
    assert chat(stack, key_a, branch="shared-name").status_code == 200
    assert stack.loop.run(directory.is_branch_active("iso-a/shared-name"))

    # B "finishes" the same branch id: its own (absent) branch, not A's.
    r = httpx.post(
        f"{stack.url}/v1/branches/shared-name/finish", headers={"Authorization": f"Bearer {key_b}"}, timeout=10
    )
    assert r.status_code == 200 and r.json()["finished"] is False
    assert stack.loop.run(directory.is_branch_active("iso-a/shared-name"))
    # Nor through the tenant-qualified key the directory uses.
    for crafted in ("iso-a%2Fshared-name", "iso-a/shared-name", "..%2Fiso-a%2Fshared-name"):
        r = httpx.post(
            f"{stack.url}/v1/branches/{crafted}/finish", headers={"Authorization": f"Bearer {key_b}"}, timeout=10
        )
        assert r.status_code in (400, 404), (crafted, r.text)
    assert stack.loop.run(directory.is_branch_active("iso-a/shared-name"))
    # B working on a branch of the same name, or forking from it, stays in B's namespace.
    assert (
        chat(
            stack, key_b, branch="shared-name", finished=True, headers={"X-Parent-Branch-ID": "shared-name"}
        ).status_code
        == 200
    )
    assert stack.loop.run(directory.is_branch_active("iso-a/shared-name"))
    # No tenant-facing route lists or reads branches, usage or keys.
    for path in [
        "/v1/branches",
        "/v1/branches/shared-name",
        "/v1/usage",
        "/v1/keys",
        "/v1/tenants/iso-a",
        "/v1/dashboard/billing/usage",
        "/v1/organization/usage/completions",
    ]:
        assert httpx.get(
            f"{stack.url}{path}", headers={"Authorization": f"Bearer {key_b}"}, timeout=10
        ).status_code in (404, 405), path
    # The owner finishes it.
    r = httpx.post(
        f"{stack.url}/v1/branches/shared-name/finish", headers={"Authorization": f"Bearer {key_a}"}, timeout=10
    )
    assert r.json()["finished"] is True and not stack.loop.run(directory.is_branch_active("iso-a/shared-name"))


# -- cache isolation ----------------------------------------------------------------
def cached(r: httpx.Response) -> int:
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_cache_isolation_unless_an_operator_lets_tenants_share(stack: ControlPlaneStack) -> None:
    key_a, key_b = stack.tenant("cache-a"), stack.tenant("cache-b")
    key_c, key_d = stack.tenant("cache-c"), stack.tenant("cache-d")
    prompt = [PROMPT[0], {"role": "user", "content": PROMPT[1]["content"] + " Isolation drill."}]
    assert cached(chat(stack, key_a, messages=prompt)) == 0
    assert cached(chat(stack, key_a, messages=prompt)) > 0  # A's own cache works
    assert cached(chat(stack, key_b, messages=prompt)) == 0  # B gets nothing of A's

    op = stack.admin_headers()
    for tenant in ("cache-c", "cache-d"):
        r = httpx.put(
            f"{stack.url}/admin/tenants/{tenant}/policy", json={"cache_isolation": False}, headers=op, timeout=10
        )
        assert r.status_code == 200, r.text
    assert stack.loop.run(stack.gate.refresh())
    assert cached(chat(stack, key_c, messages=prompt)) == 0
    assert cached(chat(stack, key_d, messages=prompt)) > 0  # the operator let C and D share
    assert cached(chat(stack, key_b, messages=prompt)) > 0  # B's own earlier request
    fresh = stack.tenant("cache-e")
    assert cached(chat(stack, fresh, messages=prompt)) == 0  # isolated tenants still see nothing shared


# -- binding and the cluster token -----------------------------------------------------
def test_admin_and_worker_apis_bind_to_loopback_by_default() -> None:
    import argparse

    from cli import up
    from gateway.settings import GatewaySettings
    from workers.cli import build_parser

    assert GatewaySettings().host == "127.0.0.1"
    assert GatewaySettings.from_env({}).host == "127.0.0.1"
    for add in (up.add_arguments, up.add_gateway_arguments):
        p = argparse.ArgumentParser()
        add(p)
        assert p.parse_args([]).host == "127.0.0.1"
    assert build_parser().parse_args(["--model", "m"]).host == "127.0.0.1"


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3"])
def test_worker_beyond_loopback_needs_a_cluster_token(host: str, tmp_path: pathlib.Path) -> None:
    env = {k: v for k, v in __import__("os").environ.items() if k != "EVOLVING_CLUSTER_TOKEN"}
    out = subprocess.run(
        [sys.executable, "-m", "workers.cli", "--model", str(tmp_path), "--host", host, "--port", "8437"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=env,
    )
    assert out.returncode != 0
    assert "cluster-token" in out.stderr


from workers.protocol import EngineState  # noqa: E402  (beside the stub that reports it)


class _StubEngine:
    """Just enough engine for the server's auth middleware and phase route."""

    ready = True
    kv_events = None
    state = EngineState.ALIVE
    restarts = 0  # engine cores restarted in place (workers.engine_heal)

    async def start(self) -> None: ...
    async def stop(self) -> None: ...

    def counts(self) -> tuple[int, int]:
        return 0, 0


async def test_worker_internal_api_requires_the_token_when_set() -> None:
    from core import Phase
    from workers.engine import EngineConfig
    from workers.server import create_app

    app = create_app(
        EngineConfig(model="unused", node_id="tok"),
        Phase.DECODE,
        cluster_token="cluster-s3cret",
        engine=_StubEngine(),  # type: ignore[arg-type]  # only the token check runs: no engine behind it
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://w") as c:
        for headers in (
            {},
            {"Authorization": "Bearer nope"},
            {"Authorization": "Bearer "},
            {"Authorization": "Bearer cluster-s3cret-and-more"},
        ):
            r = await c.get("/internal/phase", headers=headers)
            assert r.status_code == 401, headers
            assert (await c.post("/internal/generate", headers=headers, json={})).status_code == 401
            assert (await c.post("/internal/phase", headers=headers, json={"phase": "prefill"})).status_code == 401
        ok = await c.get("/internal/phase", headers={"Authorization": "Bearer cluster-s3cret"})
        assert ok.status_code == 200 and ok.json()["node_id"] == "tok"
        assert (await c.get("/healthz")).status_code == 200  # probes need no token

    # The gateway's worker client sends it on every call.
    seen: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        return httpx.Response(200, json={"node_id": "tok", "phase": "decode"})

    from gateway.upstream.http_client import HttpWorkerClient

    client = HttpWorkerClient(cluster_token="cluster-s3cret", transport=httpx.MockTransport(handler))
    await client.phase("http://w")
    await client.aclose()
    assert seen == ["Bearer cluster-s3cret"]
