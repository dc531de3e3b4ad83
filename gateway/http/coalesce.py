"""Writes to one connection gathered per event-loop turn: one `writelines`
(one `writev`) instead of one `send` per write.

The HTTP server writes a response's head and each body message as it gets
them; a streamed answer whose tokens the worker sent together (or a plain
answer: head, then body) was one system call per piece — 18 for a 16-token
stream, the biggest share of the server's own CPU per request here
(docs/benchmarks-history.md). `CoalescingTransport` keeps what is written
during one turn of the loop and hands it to the real transport at the start
of the next (`loop.call_soon`), or at once when `max_pending` bytes are
waiting, before `close()`, and before anything that reads the transport's
write state. Order is kept; no byte waits for more than the rest of the
current turn, so a token that arrives alone goes out alone, at once.

The flushes of one turn share one loop callback (`_Flusher`, one per
loop): relaying 256 streams whose tokens arrive on one tick is one
callback, not 256.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

_MAX_PENDING = 64 * 1024


class _Flusher:
    """The transports of one loop with writes waiting; flushed by one callback at the next turn."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._due: list[CoalescingTransport] = []

    def add(self, transport: CoalescingTransport) -> None:
        if not self._due:
            self._loop.call_soon(self._run)
        self._due.append(transport)

    def _run(self) -> None:
        due, self._due = self._due, []
        for transport in due:
            transport._scheduled = False
            transport.flush()


_FLUSHERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Flusher] = weakref.WeakKeyDictionary()


def _flusher(loop: asyncio.AbstractEventLoop) -> _Flusher:
    flusher = _FLUSHERS.get(loop)
    if flusher is None:
        flusher = _FLUSHERS[loop] = _Flusher(loop)
    return flusher


class CoalescingTransport(asyncio.Transport):
    """Forwards to `transport`; `write`s are gathered until the loop's next turn."""

    def __init__(
        self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop, *, max_pending: int = _MAX_PENDING
    ):
        super().__init__()
        self._transport = transport
        self._flusher = _flusher(loop)
        self._max_pending = max_pending
        self._pending: list[bytes] = []
        self._size = 0
        self._scheduled = False

    # -- writing ----------------------------------------------------------------
    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        self._pending.append(bytes(data))
        self._size += len(data)
        if self._size >= self._max_pending:
            self.flush()
        elif not self._scheduled:
            self._scheduled = True
            self._flusher.add(self)

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def flush(self) -> None:
        """Hand every gathered write to the real transport now (a closed one drops them, as its `write` would)."""
        if not self._pending:
            return
        pending, self._pending, self._size = self._pending, [], 0
        if self._transport.is_closing():
            return  # the connection is gone or going: nobody reads these bytes
        if len(pending) == 1:
            self._transport.write(pending[0])
        else:
            self._transport.writelines(pending)

    def get_write_buffer_size(self) -> int:
        return self._size + self._transport.get_write_buffer_size()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    # -- ending -----------------------------------------------------------------
    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._pending, self._size = [], 0
        self._transport.abort()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    # -- everything else, as is -------------------------------------------------
    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()
