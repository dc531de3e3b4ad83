"""A fake call tracer for `gateway.http.asgi.GatewayApp` (its `CallTracer`
protocol): it records what the app tells each traced call, in order.

    app.tracer = tracer = FakeCallTracer()
    ...; tracer.calls == [[("open", "/v1/..."), ("status", 200), ("body", 9, False), ...]]

A request with an `x-untraced` header is treated as sampled out (no call).
"""

from __future__ import annotations

from typing import Any


class FakeTracedCall:
    """What the app told one traced call, appended to `log`."""

    def __init__(self, log: list[tuple[object, ...]]) -> None:
        self.log = log

    def responded(self, status: int) -> None:
        self.log.append(("status", status))

    def sending(self, total: int, last: bool) -> None:
        self.log.append(("body", total, last))

    def failed(self, exc: BaseException) -> None:
        self.log.append(("failed", type(exc).__name__))

    def finish(self) -> None:
        self.log.append(("finish",))


class FakeCallTracer:
    def __init__(self) -> None:
        self.calls: list[list[tuple[object, ...]]] = []

    def open(self, scope: Any) -> FakeTracedCall | None:
        if any(name == b"x-untraced" for name, _ in scope["headers"]):
            return None  # sampled out
        self.calls.append([("open", scope["path"])])
        return FakeTracedCall(self.calls[-1])
