"""CoalescingTransport: writes made in one turn of the loop reach the real
transport together, in order, at the start of the next turn; close flushes
first; a closed connection's bytes are dropped."""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.http.coalesce import CoalescingTransport


class RecordingTransport(asyncio.Transport):
    """A fake transport: what reached it, call by call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, Any]] = []
        self.closing = False

    def write(self, data: Any) -> None:
        self.calls.append(("write", bytes(data)))

    def writelines(self, list_of_data: Any) -> None:
        self.calls.append(("writelines", [bytes(d) for d in list_of_data]))

    def close(self) -> None:
        self.calls.append(("close", None))
        self.closing = True

    def abort(self) -> None:
        self.calls.append(("abort", None))
        self.closing = True

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return 7

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 1)}.get(name, default)


async def test_writes_of_one_turn_go_out_together_in_order() -> None:
    real = RecordingTransport()
    t = CoalescingTransport(real, asyncio.get_running_loop())
    t.write(b"HTTP/1.1 200 OK\r\n\r\n")
    t.write(b"")  # nothing to send: no call
    t.write(bytearray(b"a"))
    t.write(memoryview(b"b"))
    assert real.calls == [] and t.get_write_buffer_size() == 19 + 2 + 7
    await asyncio.sleep(0)
    assert real.calls == [("writelines", [b"HTTP/1.1 200 OK\r\n\r\n", b"a", b"b"])]
    t.write(b"c")  # a later turn: its own call, a single write
    await asyncio.sleep(0)
    assert real.calls[1:] == [("write", b"c")]


async def test_close_flushes_first_and_abort_drops() -> None:
    real = RecordingTransport()
    t = CoalescingTransport(real, asyncio.get_running_loop())
    t.write(b"x")
    t.write(b"y")
    t.close()
    assert real.calls == [("writelines", [b"x", b"y"]), ("close", None)]
    await asyncio.sleep(0)  # the scheduled flush finds nothing left
    assert len(real.calls) == 2

    real2 = RecordingTransport()
    t2 = CoalescingTransport(real2, asyncio.get_running_loop())
    t2.write(b"x")
    t2.abort()
    await asyncio.sleep(0)
    assert real2.calls == [("abort", None)]


async def test_a_big_write_goes_out_at_once() -> None:
    real = RecordingTransport()
    t = CoalescingTransport(real, asyncio.get_running_loop(), max_pending=10)
    t.write(b"12345")
    assert real.calls == []
    t.write(b"67890")  # 10 bytes pending: the limit
    assert real.calls == [("writelines", [b"12345", b"67890"])]


async def test_bytes_for_a_closed_connection_are_dropped() -> None:
    real = RecordingTransport()
    t = CoalescingTransport(real, asyncio.get_running_loop())
    t.write(b"late")
    real.closing = True  # the peer went away before the flush
    await asyncio.sleep(0)
    assert real.calls == [] and t.is_closing()
    assert t.get_extra_info("peername") == ("127.0.0.1", 1)


async def test_connections_written_in_one_turn_flush_together_at_the_next() -> None:
    loop = asyncio.get_running_loop()
    reals = [RecordingTransport() for _ in range(3)]
    ts = [CoalescingTransport(r, loop) for r in reals]
    for i, t in enumerate(ts):
        t.write(b"%d" % i)
    ts[1].close()  # flushed now, before its close; the others wait for the turn
    assert [r.calls for r in reals] == [[], [("write", b"1"), ("close", None)], []]
    await asyncio.sleep(0)
    assert [r.calls for r in reals] == [[("write", b"0")], [("write", b"1"), ("close", None)], [("write", b"2")]]
    ts[0].write(b"x")  # the next turn: scheduled again
    await asyncio.sleep(0)
    assert reals[0].calls[1:] == [("write", b"x")]
