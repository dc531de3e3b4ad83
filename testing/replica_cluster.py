"""Several gateway replicas as separate processes, for tests and `bench replicas`.

`ReplicaCluster` starts fake workers (`python -m testing.fake_worker_app`,
the worker protocol without a model, fencing included) and N gateway
processes (`python -m cli.main gateway`, exactly what an operator runs) on
free ports, all sharing one fresh PostgreSQL database and one Redis key
namespace. It cleans up what it created: the processes, the database
(dropped), and the Redis keys under its own prefix (never FLUSHDB).

Each replica is `EVOLVING_REPLICA_ID=g<i>`; `kill`, `pause` (SIGSTOP),
`resume` (SIGCONT) and `respawn` act on one. Admin calls use the operator
token the cluster sets in `EVOLVING_ADMIN_TOKEN`.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pathlib
import secrets
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from testing.tiny_tokenizer import write_tiny_tokenizer

ROOT = pathlib.Path(__file__).resolve().parent.parent
PG_ADMIN_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres connect_timeout=3"
PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
MODEL = "demo"
BLOCK = 16


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(cond: Callable[[], Any], timeout_s: float, *, every_s: float = 0.02, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not met after {timeout_s:.1f} s")
        time.sleep(every_s)


def _pg(sql: str) -> None:
    import psycopg

    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
        conn.execute(sql)


def pg_available() -> bool:
    import psycopg

    try:
        with psycopg.connect(PG_ADMIN_DSN):
            return True
    except psycopg.OperationalError:
        return False


def redis_available(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_timeout=2).ping())
    except redis.RedisError:
        return False


def clear_redis_prefix(url: str, base: str) -> int:
    """Delete every key of one cluster namespace (`{prefix}...`); never FLUSHDB."""
    import redis

    r = redis.Redis.from_url(url, socket_timeout=5)
    keys = list(r.scan_iter(match=base + "*", count=1000))
    return int(r.delete(*keys)) if keys else 0


@dataclass
class Proc:
    name: str
    port: int
    argv: list[str]
    env: dict[str, str]
    log: pathlib.Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Proc:
        with open(self.log, "ab") as out:  # the child holds its own copy
            self.proc = subprocess.Popen(
                self.argv, cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive:
            assert self.proc is not None
            os.killpg(self.proc.pid, sig)

    def stop(self, timeout_s: float = 15.0) -> None:
        if not self.alive:
            return
        assert self.proc is not None
        self.signal(signal.SIGCONT)  # a paused process cannot handle SIGTERM
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.proc.wait(5)

    def kill(self) -> None:
        if self.alive:
            assert self.proc is not None
            self.signal(signal.SIGKILL)
            self.proc.wait(5)

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


@dataclass
class ReplicaCluster:
    tmp: pathlib.Path
    replicas: int = 3
    phases: Sequence[str] = ("decode", "decode", "decode", "decode")
    token_delay_s: float = 0.005
    switch_delay_s: float = 0.0
    redis_url: str = "redis://127.0.0.1:6379/0"
    processes: int = 1  # gateway processes per replica (`gateway --workers N`)
    env: dict[str, str] = field(default_factory=dict)  # extra EVOLVING_* settings for every replica
    admin_token: str = field(default_factory=lambda: "op-" + secrets.token_urlsafe(24))
    prefix: str = field(default_factory=lambda: f"ei-test-{uuid.uuid4().hex[:10]}")
    db_name: str = field(default_factory=lambda: f"ei_test_{uuid.uuid4().hex[:12]}")
    workers: list[Proc] = field(default_factory=list)
    gateways: list[Proc] = field(default_factory=list)

    # -- lifecycle ----------------------------------------------------------------------
    @property
    def db_url(self) -> str:
        return PG_URL.format(name=self.db_name)

    @property
    def redis_base(self) -> str:
        return "{" + self.prefix + "}"

    def start(self, *, ready_timeout_s: float = 180.0) -> ReplicaCluster:
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.tokenizer = str(write_tiny_tokenizer(self.tmp / "tok"))
        from gateway.serving.tokenize import PromptTokenizer

        vocab = PromptTokenizer.from_dir(self.tokenizer).vocab_size
        _pg(f'CREATE DATABASE "{self.db_name}"')
        for i, phase in enumerate(self.phases):
            port = free_port()
            argv = [sys.executable, "-m", "testing.fake_worker_app", "--port", str(port), "--node-id", f"w{i}"]
            argv += ["--phase", phase, "--token-delay-s", str(self.token_delay_s)]
            argv += ["--switch-delay-s", str(self.switch_delay_s), "--block-size", str(BLOCK), "--vocab", str(vocab)]
            self.workers.append(Proc(f"w{i}", port, argv, dict(os.environ), self.tmp / f"w{i}.log").start())
        for w in self.workers:
            wait_until(
                functools.partial(self._ok, w.url + "/readyz"), ready_timeout_s, every_s=0.1, what=f"{w.name} ready"
            )
        self.gateways = [self._gateway(i) for i in range(self.replicas)]
        for g in self.gateways:
            g.start()
        for g in self.gateways:
            self.wait_ready(g, ready_timeout_s)
        return self

    def _gateway(self, i: int, port: int | None = None) -> Proc:
        port = port or free_port()
        env = {
            **os.environ,
            "EVOLVING_DB_URL": self.db_url,
            "EVOLVING_DIRECTORY_URL": self.redis_url,
            "EVOLVING_REDIS_PREFIX": self.prefix,
            "EVOLVING_ADMIN_TOKEN": self.admin_token,
            "EVOLVING_SECRET_PEPPER": "replica-cluster-pepper",
            "EVOLVING_GATEWAY_REPLICAS": str(self.replicas * self.processes),
            "EVOLVING_HEARTBEAT_S": "0.2",
            "EVOLVING_LOCAL_PREFILL_MAX": "8",
            "PYTHONUNBUFFERED": "1",
            **self.env,
        }
        if self.processes == 1:
            env["EVOLVING_REPLICA_ID"] = f"g{i}"
        else:
            env.pop("EVOLVING_REPLICA_ID", None)
        argv = [sys.executable, "-m", "cli.main", "gateway", "--model", self.tokenizer, "--model-name", MODEL]
        argv += ["--port", str(port), "--block-size", str(BLOCK), "--log-level", "warning"]
        argv += ["--worker-urls", ",".join(w.url for w in self.workers), "--data-dir", str(self.tmp / f"g{i}")]
        if self.processes != 1:
            argv += ["--workers", str(self.processes)]
        return Proc(f"g{i}", port, argv, env, self.tmp / f"g{i}.log")

    def wait_ready(self, g: Proc, timeout_s: float = 120.0) -> None:
        def up() -> bool:
            if not g.alive:
                raise RuntimeError(f"gateway {g.name} exited:\n{g.tail()}")
            return self._ok(g.url + "/readyz")

        wait_until(up, timeout_s, every_s=0.1, what=f"gateway {g.name} ready")

    def respawn(self, i: int, timeout_s: float = 120.0) -> Proc:
        """Start replica i again (same port) after a kill."""
        old = self.gateways[i]
        old.kill()
        self.gateways[i] = self._gateway(i, old.port).start()
        self.wait_ready(self.gateways[i], timeout_s)
        return self.gateways[i]

    def close(self) -> None:
        for p in [*self.gateways, *self.workers]:
            with contextlib.suppress(Exception):
                p.stop()
        with contextlib.suppress(Exception):
            _pg(f'DROP DATABASE IF EXISTS "{self.db_name}" WITH (FORCE)')
        with contextlib.suppress(Exception):
            clear_redis_prefix(self.redis_url, self.redis_base)

    @staticmethod
    def _ok(url: str) -> bool:
        try:
            return httpx.get(url, timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    # -- calls --------------------------------------------------------------------------
    def admin(self, i: int, method: str, path: str, json: Any = None, timeout_s: float = 30.0) -> httpx.Response:
        return httpx.request(
            method,
            f"{self.gateways[i].url}/admin{path}",
            json=json,
            headers={"Authorization": f"Bearer {self.admin_token}"},
            timeout=timeout_s,
        )

    def tenant(self, name: str, policy: dict[str, Any] | None = None, via: int = 0) -> str:
        """Create a tenant (id == name) with one key through replica `via`; returns the key."""
        r = self.admin(via, "POST", "/tenants", {"name": name, "id": name, "policy": policy or {}})
        assert r.status_code == 201, r.text
        r = self.admin(via, "POST", f"/tenants/{name}/keys", {"name": "k"})
        assert r.status_code == 201, r.text
        return str(r.json()["secret"])

    def planner(self, i: int) -> dict[str, Any]:
        r = self.admin(i, "GET", "/planner", timeout_s=5.0)
        r.raise_for_status()
        return dict(r.json())

    def alive(self) -> list[int]:
        return [i for i, g in enumerate(self.gateways) if g.alive]

    def leaders(self, among: Sequence[int] | None = None) -> list[int]:
        """Replicas that report themselves as leading right now."""
        out = []
        for i in among if among is not None else self.alive():
            try:
                lead = self.planner(i).get("leadership") or {}
            except httpx.HTTPError:
                continue
            if lead.get("leading"):
                out.append(i)
        return out

    def wait_leader(self, among: Sequence[int] | None = None, timeout_s: float = 15.0) -> int:
        found = wait_until(lambda: self.leaders(among), timeout_s, every_s=0.05, what="a leader")
        return int(found[0])

    def worker_stats(self) -> list[dict[str, Any]]:
        return [httpx.get(w.url + "/internal/stats", timeout=5).json() for w in self.workers]

    def worker_switches(self) -> list[list[dict[str, Any]]]:
        return [httpx.get(w.url + "/testing/switches", timeout=5).json() for w in self.workers]

    def chat(self, i: int, key: str, *, branch: str | None = None, max_tokens: int = 4, **extra: str) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}", **extra}
        if branch:
            headers["X-Branch-ID"] = branch
        messages = [{"role": "user", "content": "Agents call tools."}]
        body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens}
        return httpx.post(f"{self.gateways[i].url}/v1/chat/completions", json=body, headers=headers, timeout=30)


@contextlib.contextmanager
def replica_cluster(tmp: pathlib.Path, **kwargs: Any) -> Iterator[ReplicaCluster]:
    cluster = ReplicaCluster(tmp, **kwargs)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()
