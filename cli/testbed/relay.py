"""TCP relays between the testbed's hosts and the root namespace.

No address exists outside the testbed's namespaces, so the controlling
process carries the few connections that must cross:

- services in: each host's own loopback gets listeners on the service ports
  (Redis 6379, PostgreSQL 5432 by default) that relay to the root
  namespace's 127.0.0.1, so code inside keeps plain TCP URLs
  (redis://127.0.0.1:6379/0);
- one port out: the root's 127.0.0.1:<port> relays to a host's address (the
  gateway), for a client outside.

A listener belongs to the namespace it was created in (`inside`); the
accept and pipe threads are started from the root namespace, so their
outgoing connections start there unless `target_ns` says otherwise.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading

from cli.testbed.netns import Testbed, inside

SERVICES = {"redis": 6379, "postgres": 5432}


def _pipe(a: socket.socket, b: socket.socket) -> None:
    try:
        while True:
            ready, _, _ = select.select([a, b], [], [], 1.0)
            for s in ready:
                data = s.recv(1 << 16)
                if not data:
                    return
                (b if s is a else a).sendall(data)
    except OSError:
        pass  # either side went away: close both
    finally:
        a.close()
        b.close()


class Relay:
    """Accept on `listener`; connect to `target` (inside `target_ns` when
    given); copy bytes both ways until either side closes."""

    def __init__(self, listener: socket.socket, target: tuple[str, int], target_ns: str | None = None) -> None:
        self.listener, self.target, self.target_ns = listener, target, target_ns
        self.thread = threading.Thread(target=self._accept, name=f"relay-{target[1]}", daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return int(self.listener.getsockname()[1])

    def _connect(self) -> socket.socket:
        ctx = inside(self.target_ns) if self.target_ns else contextlib.nullcontext()
        with ctx:
            return socket.create_connection(self.target, timeout=5)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return  # closed
            try:
                up = self._connect()
                up.settimeout(None)
            except OSError:
                conn.close()
                continue
            threading.Thread(target=_pipe, args=(conn, up), daemon=True).start()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()


def _listen(addr: str, port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port))
    s.listen(64)
    return s


def relay_services(tb: Testbed, services: dict[str, int] | None = None) -> list[Relay]:
    """Every host's 127.0.0.1:<port> -> the root's 127.0.0.1:<port>; closed with the testbed."""
    relays = []
    for h in tb.layout.hosts:
        listeners = []
        with inside(h.netns):
            for port in (services or SERVICES).values():
                listeners.append((port, _listen("127.0.0.1", port)))
        relays += [Relay(ls, ("127.0.0.1", port)) for port, ls in listeners]  # threads start in the root ns
    for r in relays:
        tb.on_down(r.close)
    return relays


def expose(tb: Testbed, host: str, port: int, root_port: int = 0) -> Relay:
    """The root's 127.0.0.1:<root_port> (0: a free one) -> <host's address>:<port>."""
    h = tb.host(host)
    relay = Relay(_listen("127.0.0.1", root_port), (h.addr, port), target_ns=h.netns)
    tb.on_down(relay.close)
    return relay
