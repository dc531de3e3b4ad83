"""Ports for servers that bind a while after their port is chosen.

A port the kernel hands out for `bind(0)` lies in its ephemeral range
(32768-60999 here), the range it also takes the local end of every
outgoing connection from. A worker or an `up` gateway binds its port a
minute after a test chose it (vLLM's start comes first): meanwhile such a
port may become some connection's local port, and the server's bind fails
with "address already in use" (seen in `make test`). These ports come from
below that range, where only a listener takes a port.
"""

from __future__ import annotations

import contextlib
import random
import socket

LOW, HIGH = 20000, 32000  # below the ephemeral range


def stable_ports(count: int) -> list[int]:
    """`count` distinct ports free now, from [LOW, HIGH): each is held until
    all are bound, so none is handed out twice."""
    rng = random.Random()
    ports: list[int] = []
    with contextlib.ExitStack() as stack:
        for _ in range(200 * count):
            s = stack.enter_context(socket.socket())
            port = rng.randrange(LOW, HIGH)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            ports.append(port)
            if len(ports) == count:
                return ports
    raise RuntimeError(f"no {count} free ports in {LOW}-{HIGH}")
