"""The peers a node pulls from: addresses, first contact, failures, recovery.

Shell around `PeerBook` (kvpool.connector.peer_book) and the transport, used
by the worker side from two threads: the load path (`begin` / `connect` /
`failed` / `end` around each pull) and the recovery loop (`heal`, every
RECOVERY_INTERVAL_S). First contact and every reconnection fetch the peer's
`GET /internal/kv/agent` with the cluster token (a worker bound beyond
loopback refuses /internal without it), so a restarted peer's new NIXL agent
is picked up. A reconnection waits until no timed-out read to the peer is in
flight (its slots may still be written), re-adds the peer (a fresh
connection: an old one may sit in TCP back-off long after the link is back)
and probes it with a 16-byte read.
"""

from __future__ import annotations

import base64
import collections
import logging
import threading
import time
from collections.abc import Callable

import httpx

from kvpool.agent_info import AgentInfo
from kvpool.connector.peer_book import Backoff, PeerBook
from kvpool.events import PeerChanged, publish
from kvpool.transport.base import BlockTransport, PeerUnavailable, TransferError, TransferTimeout

log = logging.getLogger(__name__)

RECOVERY_INTERVAL_S = 0.25
PROBE_TIMEOUT_S = 1.0


def failure_reason(exc: BaseException) -> str:
    """A short, stable word for logs, stats and the peer's state."""
    if isinstance(exc, TransferTimeout):
        return "timeout"
    if isinstance(exc, PeerUnavailable):
        return "unavailable"
    if isinstance(exc, httpx.HTTPStatusError):
        return f"http {exc.response.status_code}"
    if isinstance(exc, httpx.HTTPError):
        return "unreachable"
    return "error"


class PeerLinks:
    def __init__(
        self,
        transport: BlockTransport,
        *,
        cluster_token: str | None,
        timeout_s: float,
        events_socket: str | None = None,
        backoff: Backoff | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.transport = transport
        self.book = PeerBook(backoff)
        self._token, self._timeout_s = cluster_token, timeout_s
        self._events_socket, self._clock = events_socket, clock
        self._urls: dict[str, str] = {}
        self._inflight: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def note_urls(self, urls: dict[str, str]) -> None:
        with self._lock:
            self._urls.update(urls)

    # -- the load path ----------------------------------------------------------
    def begin(self, node_id: str) -> bool:
        """Start a pull from the peer: False (and nothing to end) while it is down."""
        with self._lock:
            if not self.book.usable(node_id):
                return False
            self._inflight[node_id] += 1
            return True

    def end(self, node_id: str) -> None:
        with self._lock:
            self._inflight[node_id] -= 1

    def connect(self, node_id: str) -> None:
        """Make sure the transport can read the peer (first contact: its agent info)."""
        if node_id not in self.transport.peers():
            self.transport.add_peer(node_id, self._descriptor(node_id))

    def failed(self, node_id: str, exc: BaseException) -> None:
        """A pull from the peer failed: mark it down (the recovery loop heals it)."""
        reason = failure_reason(exc)
        with self._lock:
            went_down = self.book.failed(node_id, self._clock(), reason)
        if went_down:
            log.warning(
                "KV peer %s is down (%s: %s); loads from it are recomputed until it answers", node_id, reason, exc
            )
            self._publish(PeerChanged(peer=node_id, state="down", reason=reason))

    # -- the recovery loop -------------------------------------------------------
    def heal(self) -> list[int]:
        """One recovery round: try the peers that are due; returns local slots
        whose timed-out reads have finished (safe to reuse now)."""
        freed = self.transport.drain_quarantine()
        with self._lock:
            due = self.book.due(self._clock())
        for node_id in due:
            with self._lock:
                busy = self._inflight[node_id] > 0
            if busy or self.transport.quarantined(node_id):
                with self._lock:
                    self.book.postpone(node_id, self._clock(), RECOVERY_INTERVAL_S)
                continue
            try:
                self.transport.add_peer(node_id, self._descriptor(node_id))
                self.transport.probe(node_id, min(PROBE_TIMEOUT_S, self._timeout_s))
            except (TransferError, ValueError, httpx.HTTPError) as exc:
                with self._lock:
                    self.book.retry_failed(node_id, self._clock(), failure_reason(exc))
                log.info("KV peer %s still down: %s", node_id, exc)
                continue
            with self._lock:
                down_for = self.book.reconnected(node_id, self._clock())
            log.warning("KV peer %s is back after %.1f s; loads from it resume", node_id, down_for)
            self._publish(PeerChanged(peer=node_id, state="up"))
        return freed

    # -- internals -------------------------------------------------------------
    def _descriptor(self, node_id: str) -> bytes:
        with self._lock:
            url = self._urls.get(node_id)
        if url is None:
            raise ValueError(f"no address for peer {node_id}")
        headers = {"Authorization": f"Bearer {self._token}"} if self._token else {}
        r = httpx.get(f"{url}/internal/kv/agent", headers=headers, timeout=self._timeout_s)
        try:
            info = AgentInfo(**r.raise_for_status().json())
        except TypeError as exc:
            raise ValueError(f"{url} answered a malformed agent info: {exc}") from exc
        if info.node_id != node_id or not info.metadata_b64:
            raise ValueError(f"{url} serves node {info.node_id!r} without a transport agent for {node_id!r}")
        return base64.b64decode(info.metadata_b64)

    def _publish(self, event: PeerChanged) -> None:
        if self._events_socket:
            publish(self._events_socket, event)
