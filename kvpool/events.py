"""Typed events from the KV connector to the worker's HTTP process.

vLLM runs the connector's scheduler side in its EngineCore process; it alone
assigns host-store slots, so it alone knows where a request's blocks were
saved. Its worker side times each forward pass where it runs. Both send
small JSON datagrams on a Unix socket the worker listens on
(`workers.kv_events.KVEventChannel`); block data never travels this way.

Wire form (one JSON object per datagram, `type` first):

    {"type": "saved", "rid": str, "blocks": [[hash, slot], ...], "external_tokens": int}
    {"type": "dropped", "blocks": [[hash, slot], ...]}
    {"type": "iteration", "t": unix_s, "elapsed_ms": float, "prefill_requests": int,
     "decode_requests": int, "uncached_prompt_tokens": int, "cached_prompt_tokens": int,
     "generated_tokens": int, "context_tokens": int, "attention_pairs": int}
    {"type": "pull", "peer": str, "outcome": str, "block_count": int, "seconds": float}
    {"type": "peer", "peer": str, "state": "up" | "down", "reason": str}

`publish` never raises (the directory is best-effort); `decode` raises
`EventDecodeError` on anything that is not one of these.
"""

from __future__ import annotations

import json
import socket
from dataclasses import asdict, dataclass
from typing import Any

Block = tuple[str, int]  # (block hash, host-store slot)


class EventDecodeError(ValueError):
    """A datagram that is not a KV event."""


@dataclass(frozen=True)
class BlocksSaved:
    """A request's full blocks are in this node's host store (prefill end, migration)."""

    rid: str  # the worker-level request id
    blocks: tuple[Block, ...]
    external_tokens: int = 0  # prompt tokens the request loaded from the pool


@dataclass(frozen=True)
class BlocksDropped:
    """Blocks evicted from this node's host store."""

    blocks: tuple[Block, ...]


@dataclass(frozen=True)
class StepTimed:
    """One engine step as the model runner timed it (loads and saves included)."""

    t: float  # unix seconds at the end of the step
    elapsed_ms: float
    prefill_requests: int
    decode_requests: int
    uncached_prompt_tokens: int
    cached_prompt_tokens: int
    generated_tokens: int
    context_tokens: int
    attention_pairs: int = 0


# Outcomes of one pull from one peer: read and verified; tags no longer named
# the blocks (the peer evicted them: not a fault); the read timed out; the
# peer was unreachable or disconnected; any other failure; not tried because
# the peer is down (recomputed at once).
PULL_OUTCOMES = ("ok", "stale", "timeout", "unavailable", "error", "skipped")


@dataclass(frozen=True)
class PullDone:
    """One pull of a load's blocks from one peer, as the model runner saw it."""

    peer: str
    outcome: str  # one of PULL_OUTCOMES
    block_count: int
    seconds: float
    rid: str = ""  # the request the blocks were pulled for ("": not known)
    ended_at: float = 0.0  # unix seconds when the pull ended (0: not known); its span's end


@dataclass(frozen=True)
class PeerChanged:
    """A peer went down (pulls skip it) or came back."""

    peer: str
    state: str  # "up" | "down"
    reason: str = ""


KVEvent = BlocksSaved | BlocksDropped | StepTimed | PullDone | PeerChanged
_TYPES: dict[str, type[Any]] = {
    "saved": BlocksSaved,
    "dropped": BlocksDropped,
    "iteration": StepTimed,
    "pull": PullDone,
    "peer": PeerChanged,
}
_NAMES = {cls: name for name, cls in _TYPES.items()}


def encode(event: KVEvent) -> bytes:
    body = asdict(event)
    if "blocks" in body:
        body["blocks"] = [[h, s] for h, s in body["blocks"]]
    return json.dumps({"type": _NAMES[type(event)], **body}).encode()


def _blocks(raw: Any) -> tuple[Block, ...]:
    if not isinstance(raw, list):
        raise EventDecodeError("blocks must be a list of [hash, slot]")
    out: list[Block] = []
    for entry in raw:
        if not (
            isinstance(entry, list)
            and len(entry) == 2
            and isinstance(entry[0], str)
            and isinstance(entry[1], int)
            and not isinstance(entry[1], bool)
            and entry[1] >= 0
        ):
            raise EventDecodeError(f"bad block entry {entry!r}: want [hash string, slot >= 0]")
        out.append((entry[0], entry[1]))
    return tuple(out)


def decode(data: bytes) -> KVEvent:
    try:
        body = json.loads(data)
    except ValueError as exc:
        raise EventDecodeError(f"not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise EventDecodeError("not an object")
    kind = body.pop("type", None)
    cls = _TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise EventDecodeError("unknown event type")
    if "blocks" in body:
        body["blocks"] = _blocks(body["blocks"])
    try:
        event: KVEvent = cls(**body)
    except TypeError as exc:
        raise EventDecodeError(str(exc)) from exc
    if isinstance(event, PullDone) and event.outcome not in PULL_OUTCOMES:
        raise EventDecodeError(f"unknown pull outcome {event.outcome!r}")
    if isinstance(event, PeerChanged) and event.state not in ("up", "down"):
        raise EventDecodeError(f"unknown peer state {event.state!r}")
    return event


def publish(path: str, event: KVEvent) -> None:
    """Send one event (from the connector's processes). Never raises."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(encode(event), path)
    except OSError:
        pass  # the worker's HTTP side is gone or busy; the directory is best-effort
