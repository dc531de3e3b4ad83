"""The network-namespace testbed itself: hosts, isolation, relayed services,
cables, and that nothing it created survives it (also after a crash)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from typing import Any

import psycopg
import pytest
import redis

from cli.testbed import netns
from cli.testbed.netns import PrefixBusy, Testbed, list_netns
from testing.netns_testbed import PREFIX, require_testbed

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(300)]


def _listen(tb: Testbed, host: str, port: int) -> socket.socket:
    def make() -> socket.socket:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((tb.host(host).addr, port))
        s.listen()
        s.settimeout(2.0)
        return s

    return tb.call_in(host, make)


def _echo_once(server: socket.socket) -> threading.Thread:
    def run() -> None:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        with conn:
            conn.sendall(conn.recv(64))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _round_trip(tb: Testbed, src: str, dst: str, port: int) -> bytes:
    def talk() -> bytes:
        with socket.create_connection((tb.host(dst).addr, port), timeout=2.0) as c:
            c.sendall(b"across hosts")
            return c.recv(64)

    return tb.call_in(src, talk)


def test_hosts_have_their_own_address_and_reach_each_other(netns_testbed: Testbed) -> None:
    tb = netns_testbed
    addrs = {h.name: h.addr for h in tb.layout.hosts}
    assert len(set(addrs.values())) == 3
    for h in tb.layout.hosts:
        links = tb.run(h.name, ["ip", "-br", "addr"]).stdout.split("\n")
        names = sorted(line.split()[0].split("@")[0] for line in links if line.strip())
        assert names == ["eth0", "lo"]
        assert h.addr in tb.run(h.name, ["ip", "-br", "addr", "show", "eth0"]).stdout
    server = _listen(tb, "w1", 9101)
    _echo_once(server)
    assert _round_trip(tb, "gw", "w1", 9101) == b"across hosts"
    server.close()


def test_the_root_namespace_has_no_way_into_a_host(netns_testbed: Testbed) -> None:
    tb = netns_testbed
    root_links = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout
    assert (
        "v-" not in root_links
        and tb.host("w1").addr not in subprocess.run(["ip", "-br", "addr"], capture_output=True, text=True).stdout
    )
    server = _listen(tb, "w1", 9102)
    # The machine's own network may answer a connect (a proxy); what matters is that nothing arrives.
    with contextlib.suppress(OSError):
        socket.create_connection((tb.host("w1").addr, 9102), timeout=1.0).close()
    with pytest.raises(TimeoutError):
        server.accept()
    server.close()


def test_redis_and_postgresql_are_reachable_from_inside_a_host(netns_testbed: Testbed) -> None:
    key = f"ei-tb-test:{uuid.uuid4().hex}"

    def use_services() -> tuple[Any, int]:  # redis-py types get() for either decode_responses setting
        r = redis.Redis.from_url("redis://127.0.0.1:6379/0")
        r.set(key, "from w2", ex=60)
        got = r.get(key)
        r.delete(key)
        with psycopg.connect("host=127.0.0.1 port=5432 user=postgres dbname=postgres connect_timeout=5") as conn:
            one = conn.execute("select 1").fetchone()
        return got, one[0] if one else 0

    assert netns_testbed.call_in("w2", use_services) == (b"from w2", 1)


def test_a_pulled_cable_cuts_the_host_off_until_plugged_back(netns_testbed: Testbed) -> None:
    tb = netns_testbed
    server = _listen(tb, "w2", 9103)
    tb.set_link("w2", False)
    try:
        with pytest.raises(OSError, match="timed out"):
            _round_trip(tb, "gw", "w2", 9103)
    finally:
        tb.set_link("w2", True)
    _echo_once(server)
    assert _round_trip(tb, "gw", "w2", 9103) == b"across hosts"
    before = tb.link_bytes("w2")
    _echo_once(server)
    _round_trip(tb, "gw", "w2", 9103)
    after = tb.link_bytes("w2")
    assert after["rx_bytes"] > before["rx_bytes"] and after["tx_bytes"] > before["tx_bytes"]
    server.close()


def test_a_second_testbed_with_a_live_prefix_is_refused(netns_testbed: Testbed) -> None:
    with pytest.raises(PrefixBusy):
        Testbed(["x"], prefix=PREFIX).up()
    with pytest.raises(PrefixBusy):
        netns.cleanup(PREFIX)
    assert all(ns in list_netns() for ns in netns_testbed.layout.namespaces)


CHILD = textwrap.dedent(
    """
    import sys, time
    from cli.testbed.netns import Testbed
    with Testbed(["a", "b"], prefix=sys.argv[1]) as tb:
        sleeper = tb.popen("a", ["sleep", "300"])
        print("up", sleeper.pid, flush=True)
        if sys.argv[2] == "raise":
            time.sleep(1.0)
            raise RuntimeError("boom inside the testbed")
        time.sleep(300)
    """
)


def _ours(prefix: str) -> list[str]:
    return [n for n in list_netns() if n.startswith(prefix + "-")]


def _gone(pid: int, timeout_s: float = 10.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("how", ["raise", "sigterm", "sigkill"])
def test_nothing_survives_the_testbed(how: str) -> None:
    require_testbed()
    prefix = f"ei-tb-{how[:5]}"
    p = subprocess.Popen([sys.executable, "-c", CHILD, prefix, how], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    word, pid = p.stdout.readline().split()
    assert word == "up" and len(_ours(prefix)) == 3
    if how == "sigterm":
        p.terminate()
    elif how == "sigkill":
        p.kill()
    p.wait(60)
    if how == "sigkill":  # no chance to clean up: the next run (or `testbed cleanup`) does
        assert len(_ours(prefix)) == 3
        assert sorted(netns.cleanup(prefix)) == sorted(f"{prefix}-{n}" for n in ("a", "b", "br"))
    assert _ours(prefix) == []
    assert not (netns.RUN / prefix).exists() and not (netns.RUN / f"{prefix}.lock").exists()
    assert _gone(int(pid)), "a process started inside the testbed outlived it"
