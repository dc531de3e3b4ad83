"""Node health and the poison-request rule (pure: no I/O, no clock).

A node serves only while its process answers heartbeats **and** its vLLM
engine core is alive: a worker process can outlive its engine (a crash in
the engine core, an OOM kill of that child), and then every request sent
there fails. `assess` is the one rule the registry applies to each
heartbeat outcome:

    heartbeat answered, engine alive     -> HEALTHY
    heartbeat answered, engine not alive -> ENGINE_DEAD   (out of routing at once)
    heartbeat failed, failures < limit   -> the state it had (a slow beat)
    heartbeat failed, failures >= limit  -> UNREACHABLE

A request that was running on an engine when it died is a suspect; one that
was running on `max_engine_deaths` (2) engines that died is a **poison
request**: `Quarantine` remembers its fingerprint (prompt tokens and
sampling, less the seed the gateway may have drawn), so neither its continuation nor a client's retry of it reaches a
third engine; the gateway answers it with `RequestQuarantined`.

An engine that dies takes every request on it down, so its bystanders are
suspects too. Two rules keep them from being taken for the poison:
- `SuspectIsolation`: a suspect's next attempt goes to a node no other
  suspect is on, in its first step there or running past it, and keeps the
  others' attempts off that node until it ends (when every node has one, a
  suspect waits, then takes any). A poison request kills the engine in its
  first step (its prefill, or the step that crashed before, rerun), and
  every request on that node with it, so the second engine it kills has no
  other suspect on it: bystanders resumed from the first death do not share
  its second. (`bench chaos` saw two bystanders quarantined when only first
  steps were kept apart: they were decoding on the node where the poison's
  first step then ran.)
- `Quarantine.acquit`: a suspect that finishes on another engine did not kill
  it; its deaths are forgotten, so deaths hours apart (two unrelated OOM
  kills) never add up to a quarantine of an innocent, often-repeated request.
"""

from __future__ import annotations

import collections
import enum
import hashlib
from collections.abc import Sequence


class NodeHealth(enum.Enum):
    HEALTHY = "healthy"
    ENGINE_DEAD = "engine_dead"  # the process answers; its engine core is gone
    UNREACHABLE = "unreachable"  # missed heartbeats, or a refused connection


def assess(current: NodeHealth, *, answered: bool, engine_alive: bool, failures: int, max_failures: int) -> NodeHealth:
    """The node's health after one heartbeat (see the module docstring).

    `failures` counts consecutive failed heartbeats including this one
    (0 when it answered); `max_failures` >= 1.
    """
    if max_failures < 1:
        raise ValueError("max_failures must be >= 1")
    if answered:
        return NodeHealth.HEALTHY if engine_alive else NodeHealth.ENGINE_DEAD
    return NodeHealth.UNREACHABLE if failures >= max_failures else current


def request_fingerprint(prompt_token_ids: Sequence[int], sampling_json: str) -> str:
    """Identity of a request for quarantine: the same prompt sampled the same way."""
    h = hashlib.sha256()
    h.update(len(prompt_token_ids).to_bytes(8, "little"))
    for t in prompt_token_ids:
        h.update(int(t).to_bytes(4, "little", signed=False))
    h.update(sampling_json.encode())
    return h.hexdigest()


class Quarantine:
    """Engine deaths per request fingerprint; bounded, oldest forgotten first.

    `record_death(fp)` once per engine that died with the request on it;
    `is_poison(fp)` once that happened `max_engine_deaths` times.
    """

    def __init__(self, *, max_engine_deaths: int = 2, capacity: int = 4096) -> None:
        if max_engine_deaths < 1 or capacity < 1:
            raise ValueError("max_engine_deaths and capacity must be >= 1")
        self.max_engine_deaths = max_engine_deaths
        self._capacity = capacity
        self._deaths: collections.OrderedDict[str, int] = collections.OrderedDict()
        self.quarantined = 0  # requests that became poison (a metric)

    def record_death(self, fp: str) -> int:
        """Count one engine death under request `fp`; returns its deaths so far."""
        n = self._deaths.pop(fp, 0) + 1
        self._deaths[fp] = n
        while len(self._deaths) > self._capacity:
            self._deaths.popitem(last=False)
        if n == self.max_engine_deaths:
            self.quarantined += 1
        return n

    def deaths(self, fp: str) -> int:
        return self._deaths.get(fp, 0)

    @property
    def any_deaths(self) -> bool:
        """Whether any request has an engine death on record (else no fingerprint is needed)."""
        return bool(self._deaths)

    def acquit(self, fp: str) -> None:
        """Request `fp` finished on an engine after one died under it: forget
        its deaths (a poison request, once quarantined, stays so)."""
        if not self.is_poison(fp):
            self._deaths.pop(fp, None)

    def is_poison(self, fp: str) -> bool:
        return self.deaths(fp) >= self.max_engine_deaths


class SuspectIsolation:
    """A suspect (a request an engine died under) starts an attempt only on a
    node with no other suspect on it; see the module docstring. One
    gateway's view: replicas isolate their own suspects."""

    def __init__(self) -> None:
        self._holder: dict[str, str] = {}  # node id -> the suspect in its first step there
        self._running: dict[str, set[str]] = {}  # node id -> suspects past their first step there

    def held(self) -> frozenset[str]:
        """Nodes another suspect's next attempt must avoid."""
        return frozenset(self._holder).union(self._running)

    def hold(self, node_id: str, request_id: str) -> None:
        """`request_id` starts its attempt on `node_id` (which it may share
        with a suspect only when none was free: then the newest holds it)."""
        self._holder[node_id] = request_id

    def started(self, node_id: str, request_id: str) -> None:
        """Its first token there came: no longer the node's first step, still
        on it (other suspects' attempts keep off until `release`)."""
        if self._holder.get(node_id) == request_id:
            del self._holder[node_id]
        self._running.setdefault(node_id, set()).add(request_id)

    def release(self, node_id: str, request_id: str) -> None:
        """The attempt ended: the node is free of it. A release by a request
        that no longer holds it is a no-op."""
        if self._holder.get(node_id) == request_id:
            del self._holder[node_id]
        running = self._running.get(node_id)
        if running is not None:
            running.discard(request_id)
            if not running:
                del self._running[node_id]
