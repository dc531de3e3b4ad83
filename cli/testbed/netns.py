"""Network namespaces, cables and teardown of a testbed (root and iproute2).

    netns <prefix>-br   : lo, bridge br0 (no address), one port v-<host> per host
    netns <prefix>-<h>  : lo, eth0 (the other end of v-<h>) with the host's address

Both ends of every veth are created inside our namespaces, so nothing ever
appears in the root namespace; the only things outside them are the lock
file /run/<prefix>.lock, the state folder /run/<prefix>/ and the relay
threads of the controlling process (cli/testbed/relay.py).

Teardown (`down`, idempotent) runs from the context manager, try/finally,
atexit and SIGTERM/SIGHUP (SIGINT raises KeyboardInterrupt, which reaches the
same finally): it kills every process inside our namespaces first (a process
keeps its namespace and cable alive after `ip netns del`), then deletes the
namespaces (the veths and the bridge go with them), then the folder and the
lock. `cleanup(prefix)` does the same for a crashed run, found by prefix;
the lock (an flock, released by the kernel when its holder dies) stops one
live testbed's cleanup from deleting another live one.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import fcntl
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from cli.testbed.plan import BRIDGE, IFNAME, Host, Layout, owned, parse_netns_list, plan_layout

T = TypeVar("T")
CLONE_NEWNET = 0x40000000
RUN = pathlib.Path("/run")


class TestbedError(RuntimeError):
    """The testbed could not be built or used."""


class PrefixBusy(TestbedError):
    """Another live testbed holds this prefix."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise TestbedError(f"ip {' '.join(args)}: {r.stderr.strip() or r.returncode}")
    return r


def unavailable_reason(prefix: str = "ei-tb") -> str | None:
    """Why no testbed can run here (None: it can): checked, not assumed."""
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "the testbed needs root (it creates network namespaces and veth pairs)"
    if shutil.which("ip") is None:
        return "the `ip` tool (iproute2) is not installed"
    probe = f"{prefix}-probe{os.getpid() % 100000}"
    r = _ip("netns", "add", probe, check=False)
    if r.returncode != 0:
        return f"cannot create a network namespace: {r.stderr.strip()}"
    try:
        r = _ip("-n", probe, "link", "add", "v0", "type", "veth", "peer", "name", "v1", check=False)
        if r.returncode != 0:
            return f"cannot create a veth pair: {r.stderr.strip()}"
    finally:
        _ip("netns", "del", probe, check=False)
    return None


def list_netns() -> list[str]:
    return parse_netns_list(_ip("netns", "list").stdout)


def netns_pids(ns: str) -> list[int]:
    return [int(p) for p in _ip("netns", "pids", ns, check=False).stdout.split()]


def kill_netns_pids(ns: str, grace_s: float = 3.0) -> list[int]:
    """SIGTERM, then SIGKILL, every process whose network namespace is `ns`."""
    pids = netns_pids(ns)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in netns_pids(ns):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        end = time.monotonic() + grace_s
        while time.monotonic() < end and netns_pids(ns):
            time.sleep(0.05)
        if not netns_pids(ns):
            break
    return pids


def _lock(prefix: str) -> int:
    fd = os.open(RUN / f"{prefix}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise PrefixBusy(f"a live testbed holds prefix {prefix!r} (/run/{prefix}.lock)") from None
    return fd


def _remove(prefix: str) -> list[str]:
    gone = []
    for ns in owned(list_netns(), prefix):
        kill_netns_pids(ns)
        _ip("netns", "del", ns, check=False)
        gone.append(ns)
    shutil.rmtree(RUN / prefix, ignore_errors=True)
    return gone


def cleanup(prefix: str) -> list[str]:
    """Remove a crashed run's namespaces (processes first) and state folder;
    refuses (PrefixBusy) while a live testbed holds the prefix."""
    fd = _lock(prefix)
    try:
        return _remove(prefix)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(RUN / f"{prefix}.lock")
        os.close(fd)


_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


@contextlib.contextmanager
def inside(netns: str) -> Iterator[None]:
    """Run this thread's code in `netns` (setns applies to the calling thread
    only; sockets keep the namespace they were made in, threads started here
    inherit it)."""
    here = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{netns}", os.O_RDONLY)
    try:
        _setns(target)
        try:
            yield
        finally:
            _setns(here)
    finally:
        os.close(target)
        os.close(here)


class Testbed:
    """Hosts on one machine; see the module doc. Use as a context manager."""

    __test__ = False  # not a pytest test class, whatever its name

    def __init__(self, hosts: list[str], prefix: str = "ei-tb", subnet: str = "10.231.0.0/24") -> None:
        self.layout: Layout = plan_layout(prefix, hosts, subnet)
        self.prefix = prefix
        self.run_dir = RUN / prefix
        self._fd: int | None = None
        self._teardown: list[Callable[[], None]] = []  # relays etc., closed first
        self._state = threading.RLock()  # RLock: a signal may arrive while down() runs
        self._prev_handlers: dict[int, Any] = {}

    # -- lifecycle -------------------------------------------------------------
    def __enter__(self) -> Testbed:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    def up(self) -> Testbed:
        self._fd = _lock(self.prefix)  # PrefixBusy while another run is live
        atexit.register(self.down)
        self._install_signals()
        try:
            leftovers = _remove(self.prefix)
            if leftovers:
                print(f"testbed: removed an earlier run's leftovers: {', '.join(leftovers)}", file=sys.stderr)
            self._create()
        except BaseException:
            self.down()
            raise
        return self

    def _create(self) -> None:
        lay = self.layout
        self.run_dir.mkdir(parents=True, exist_ok=True)
        _ip("netns", "add", lay.bridge_ns)
        _ip("-n", lay.bridge_ns, "link", "set", "lo", "up")
        _ip("-n", lay.bridge_ns, "link", "add", BRIDGE, "type", "bridge")
        _ip("-n", lay.bridge_ns, "link", "set", BRIDGE, "up")
        for h in lay.hosts:
            _ip("netns", "add", h.netns)
            _ip("-n", h.netns, "link", "set", "lo", "up")
            _ip("-n", lay.bridge_ns, "link", "add", h.veth, "type", "veth", "peer", "name", IFNAME, "netns", h.netns)
            _ip("-n", lay.bridge_ns, "link", "set", h.veth, "master", BRIDGE)
            _ip("-n", lay.bridge_ns, "link", "set", h.veth, "up")
            _ip("-n", h.netns, "addr", "add", f"{h.addr}/{lay.prefix_len}", "dev", IFNAME)
            _ip("-n", h.netns, "link", "set", IFNAME, "up")
        state = {"pid": os.getpid(), "bridge_ns": lay.bridge_ns, "hosts": [h.__dict__ for h in lay.hosts]}
        (self.run_dir / "state.json").write_text(json.dumps(state))

    def on_down(self, fn: Callable[[], None]) -> None:
        """Call `fn` first when the testbed comes down (relays, child bookkeeping)."""
        self._teardown.append(fn)

    def down(self) -> None:
        with self._state:
            if self._fd is None:
                return
            fd, self._fd = self._fd, None
        try:
            for fn in reversed(self._teardown):
                with contextlib.suppress(Exception):
                    fn()
            self._teardown.clear()
            _remove(self.prefix)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(RUN / f"{self.prefix}.lock")
            os.close(fd)
            self._restore_signals()
            atexit.unregister(self.down)

    def _install_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def handler(signum: int, frame: object) -> None:
            self.down()
            raise SystemExit(128 + signum)

        for sig in (signal.SIGTERM, signal.SIGHUP):
            self._prev_handlers[sig] = signal.signal(sig, handler)

    def _restore_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, prev in self._prev_handlers.items():
            signal.signal(sig, prev)
        self._prev_handlers.clear()

    # -- use -------------------------------------------------------------------
    def host(self, name: str) -> Host:
        return self.layout.host(name)

    def popen(self, host: str, argv: list[str], env: dict[str, str] | None = None, **kw: Any) -> subprocess.Popen:
        """Start a process inside `host` (its own session: stop it by group)."""
        return subprocess.Popen(
            ["ip", "netns", "exec", self.host(host).netns, *argv],
            env={**os.environ, **(env or {})},
            start_new_session=True,
            **kw,
        )

    def run(self, host: str, argv: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ip", "netns", "exec", self.host(host).netns, *argv], capture_output=True, text=True, **kw
        )

    def call_in(self, host: str, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        """fn(*args, **kw) on a thread inside `host` (so its sockets are that host's)."""
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                with inside(self.host(host).netns):
                    box["value"] = fn(*args, **kw)
            except BaseException as exc:  # noqa: BLE001 (re-raised in the caller's thread below)
                box["error"] = exc

        t = threading.Thread(target=target, name=f"in-{host}", daemon=True)
        t.start()
        t.join()
        if "error" in box:
            raise box["error"]
        return box["value"]

    def set_link(self, host: str, up: bool) -> None:
        """Plug or pull `host`'s cable (its port on the bridge)."""
        _ip("-n", self.layout.bridge_ns, "link", "set", self.host(host).veth, "up" if up else "down")

    def limit_rate(self, host: str, rate: str | None) -> None:
        """Cap what `host` sends (tc tbf on its eth0, e.g. "20mbit"); None lifts it."""
        ns = self.host(host).netns
        if rate is None:
            subprocess.run(["tc", "-n", ns, "qdisc", "del", "dev", IFNAME, "root"], capture_output=True)
            return
        r = subprocess.run(
            ["tc", "-n", ns, "qdisc", "replace", "dev", IFNAME, "root", "tbf", "rate", rate]
            + ["burst", "32kb", "latency", "5s"],
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            raise TestbedError(f"tc tbf on {host}: {r.stderr.strip()}")

    def link_bytes(self, host: str) -> dict[str, int]:
        """Bytes through `host`'s eth0 so far (kernel counters): what crossed the cable."""
        out = json.loads(_ip("-n", self.host(host).netns, "-s", "-j", "link", "show", IFNAME).stdout)
        stats = out[0]["stats64"]
        return {"rx_bytes": int(stats["rx"]["bytes"]), "tx_bytes": int(stats["tx"]["bytes"])}
