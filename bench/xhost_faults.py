"""Network faults during KV pulls across hosts (part of `bench kvpool --hosts netns`).

Worker A (prefill, host w1) holds a prompt's blocks; worker B (decode, host
w2) is asked to decode it loading those blocks from A, while this client
(the gateway's seat, host gw) breaks things:

1. `link_down`: A's sending rate is capped so the pull lasts about a second;
   once bytes flow, A's cable is pulled. B's read must time out within its
   deadline and B must recompute; a second request during the outage must
   not wait at all (A is marked down). Cable plugged back: B's recovery loop
   must reconnect to A, and a new request's blocks must come from A again.
2. `peer_killed`: the same pull, A SIGKILLed mid-read.
3. `peer_restarted`: A started again (same node id and address, a new NIXL
   agent); B must re-register it and pull from it again.

Every request is checked against a reference decode of the same prompt on
B alone (greedy): `lost` counts requests that did not complete, and
`duplicated_tokens` tokens beyond the reference (a token delivered twice);
tokens that differ make `identical` false. `max_stall_s` is the worst extra
first-token latency against a normal disaggregated request.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from bench._kvbench import HEADERS, BenchError, StreamResult, generate, stream_generate, synthetic_tokens


@dataclass
class FaultHooks:
    """What the client may do to the testbed (the controller supplies them)."""

    cut: Callable[[bool], None]  # A's cable: False pulls it, True plugs it back
    limit: Callable[[str | None], None]  # cap A's sending rate ("2mbit"), None lifts it
    a_tx_bytes: Callable[[], int]  # bytes A has sent so far (its eth0 counter)
    kill_a: Callable[[], None]
    restart_a: Callable[[], None]  # start A again and wait until it is ready


@dataclass
class Tally:
    requests: int = 0
    completed: int = 0
    duplicated_tokens: int = 0
    mismatched: int = 0
    stalls: list[float] = field(default_factory=list)


def _peer_state(url_b: str, peer: str) -> tuple[str, dict[str, int]]:
    """B's view of A: state and pull outcome counts (GET /internal/stats)."""
    for p in httpx.get(url_b + "/internal/stats", headers=HEADERS, timeout=10).json().get("kv_peers", []):
        if p["peer"] == peer:
            return p["state"], p["pulls"]
    return "unknown", {}


def _wait_peer_up(url_b: str, peer: str, timeout_s: float) -> float:
    start = time.monotonic()
    while _peer_state(url_b, peer)[0] != "up":
        if time.monotonic() - start > timeout_s:
            raise BenchError(f"B did not reconnect to {peer} within {timeout_s:.0f} s")
        time.sleep(0.2)
    return time.monotonic() - start


class FaultSuite:
    def __init__(self, url_a: str, url_b: str, node_a: str, hooks: FaultHooks, *, prompt_tokens: int = 800) -> None:
        self.url_a, self.url_b, self.node_a, self.hooks = url_a, url_b, node_a, hooks
        self.prompt_tokens = prompt_tokens
        self.tally = Tally()
        self.baseline_ttft = 0.0
        self._rng = random.Random(23)

    # -- one request -----------------------------------------------------------
    def _prompt(self) -> tuple[list[int], list[int]]:
        """A fresh prompt and B's reference tokens for it (decoded without any pull)."""
        prompt = synthetic_tokens(self.prompt_tokens, self._rng)
        ref = stream_generate(self.url_b, self._body(prompt, uuid.uuid4().hex, None))
        return prompt, ref.tokens

    def _body(self, prompt: list[int], salt: str, load: list[dict] | None) -> dict:
        body = {
            "request_id": f"xf-{uuid.uuid4().hex[:10]}",
            "prompt_token_ids": prompt,
            "role": "decode",
            "tenant_salt": salt,
            "sampling": {"max_tokens": 24, "ignore_eos": True},
        }
        if load is not None:
            body["kv"] = {"load": load, "peers": {self.node_a: self.url_a}, "mode": "async"}
        return body

    def _prefill_on_a(self, prompt: list[int], salt: str) -> list[dict]:
        rid = f"xf-pre-{uuid.uuid4().hex[:8]}"
        pre = generate(
            self.url_a, {"request_id": rid, "prompt_token_ids": prompt, "role": "prefill", "tenant_salt": salt}
        )
        if not pre.get("saved_blocks"):
            raise BenchError(f"prefill on A saved no blocks: {pre}")
        return pre["saved_blocks"]

    def _account(self, got: StreamResult | None, ref: list[int], count_stall: bool = True) -> dict:
        self.tally.requests += 1
        if got is None or got.finish_reason is None:
            return {"completed": False}
        self.tally.completed += 1
        self.tally.duplicated_tokens += max(0, len(got.tokens) - len(ref))
        identical = got.tokens == ref
        self.tally.mismatched += 0 if identical else 1
        stall = max(0.0, (got.ttft_s or 0.0) - self.baseline_ttft)
        if count_stall:
            self.tally.stalls.append(stall)
        return {
            "completed": True,
            "identical": identical,
            "cached_tokens": got.cached_tokens,
            "ttft_s": round(got.ttft_s or 0.0, 3),
            "stall_s": round(stall, 3),
        }

    def _pull(self, during: Callable[[], None] | None = None) -> dict:
        """Prefill on A, then decode on B loading from A; `during` runs once B's pull is moving bytes."""
        prompt, ref = self._prompt()
        salt = uuid.uuid4().hex
        saved = self._prefill_on_a(prompt, salt)
        box: dict[str, StreamResult | Exception] = {}
        detail: dict[str, object] = {}
        if during is not None:
            self.hooks.limit("2mbit")  # the pull now lasts ~1 s: time to break it mid-read
        tx0 = self.hooks.a_tx_bytes()

        def run() -> None:
            try:
                box["r"] = stream_generate(self.url_b, self._body(prompt, salt, saved), timeout=120)
            except (BenchError, httpx.HTTPError) as exc:
                box["r"] = exc

        t = threading.Thread(target=run, daemon=True)
        t.start()
        if during is not None:
            end = time.monotonic() + 30
            while self.hooks.a_tx_bytes() - tx0 < 16 << 10 and t.is_alive() and time.monotonic() < end:
                time.sleep(0.01)
            detail["bytes_sent_before_fault"] = self.hooks.a_tx_bytes() - tx0
            during()
        t.join(180)
        got = box.get("r")
        if isinstance(got, Exception):
            detail["error"] = str(got)
            got = None
        return {**self._account(got, ref), **detail, "loaded_blocks": len(saved)}

    # -- the suite ---------------------------------------------------------------
    def run(self) -> dict:
        out: dict[str, object] = {}
        normal = self._pull()
        if not normal.get("completed") or not normal.get("cached_tokens"):
            raise BenchError(f"a normal pull from A did not load anything: {normal}")
        self.tally.stalls.pop()  # measured against 0: it is the baseline itself
        self.baseline_ttft = float(normal["ttft_s"])
        normal["stall_s"] = 0.0
        out["normal"] = normal
        out["link_down"] = self._link_down()
        out["peer_killed"] = self._peer_killed()
        out["peer_restarted"] = self._peer_restarted()
        return out

    def _link_down(self) -> dict:
        spare, spare_ref = self._prompt()  # its blocks are on A, to be asked for during the outage
        spare_salt = uuid.uuid4().hex
        spare_saved = self._prefill_on_a(spare, spare_salt)
        r = self._pull(during=lambda: self.hooks.cut(False))
        r["b_view_after"] = _peer_state(self.url_b, self.node_a)[0]
        # While A is unreachable and known down, B must not wait on it again.
        during = stream_generate(self.url_b, self._body(spare, spare_salt, spare_saved), timeout=120)
        r["during_outage"] = self._account(during, spare_ref)
        time.sleep(2.0)
        self.hooks.limit(None)
        self.hooks.cut(True)
        r["reconnect_s"] = round(_wait_peer_up(self.url_b, self.node_a, 60), 2)
        after = self._pull()
        r["after_restore"] = after
        r["reconnected"] = bool(after.get("completed") and after.get("cached_tokens", 0) > 0)
        return r

    def _peer_killed(self) -> dict:
        r = self._pull(during=self.hooks.kill_a)
        self.hooks.limit(None)
        r["b_view_after"] = _peer_state(self.url_b, self.node_a)[0]
        return r

    def _peer_restarted(self) -> dict:
        t0 = time.monotonic()
        self.hooks.restart_a()
        r: dict[str, object] = {"restart_s": round(time.monotonic() - t0, 1)}
        r["reconnect_s"] = round(_wait_peer_up(self.url_b, self.node_a, 120), 2)
        after = self._pull()
        r["after_restart"] = after
        r["reconnected"] = bool(after.get("completed") and after.get("cached_tokens", 0) > 0)
        return r

    def summary(self, details: dict) -> dict:
        t = self.tally
        return {
            "requests": t.requests,
            "completed": t.completed,
            "lost": t.requests - t.completed,
            "duplicated_tokens": t.duplicated_tokens,
            "identical": t.mismatched == 0,
            "max_stall_s": round(max(t.stalls, default=0.0), 3),
            "reconnected": bool(details["link_down"]["reconnected"] and details["peer_restarted"]["reconnected"]),
        }
