"""`RedisWorkloadFeed`: one workload view for every gateway replica.

Each replica appends its finished requests to one Redis stream
(`<p>:workload`) and every replica's planner reads the whole stream, so the
leader's estimate of traffic spread over N replicas is the estimate one
gateway would make on the same traffic, and a follower that takes over has
the same window already.

Turn gaps are computed where every replica's turns meet: one Lua script per
finished request reads the branch's last finish (`<p>:gap:<branch>`, kept
`gap_ttl_s`), works out the gap exactly as `planner.offered.TurnGaps` does
(max(0, arrival - last finish); the key is dropped when the branch ends) and
appends the sample with it, atomically. A branch's next turn can only start
after its previous one ended, and a replica sends each sample the moment
its request finishes, so turns of one branch reach the script in order.

Offered load: each replica counts the requests it admitted and refused
(`count_arrival`, `count_rejection`) and adds them to two cluster-wide
counters (`<p>:arrived`, `<p>:rejected`, INCRBY in the writer's round trip,
which they wait for up to `COUNTS_EVERY_S`: an arrival costs no round trip
of its own);
`counts()` answers the cluster's totals as last read (the INCRBY replies and
a GET after every stream read) plus this replica's counts not yet sent, never
less than it answered before (the planner's `ArrivalHistory` takes a counter
that went down for a restart). While Redis is unreachable the totals grow by
this replica's own counts only.

Request path: `add` only appends to a bounded local queue (never blocks). A
writer task sends what is queued in one pipelined round trip (the script
by its SHA: no SCRIPT EXISTS before each one; loaded again, and the rows it
refused sent again, after Redis lost it); a reader task
follows the stream with a blocking XREAD. While Redis is unreachable a
replica keeps its own samples (gaps from a local `TurnGaps`) and its planner
sees its own traffic only, like a lone gateway; those samples are not
replayed into the stream later (no double count).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError, RedisError

from planner.offered import TurnGaps
from planner.types import RequestSample

log = logging.getLogger(__name__)
STOP_TIMEOUT_S = 5.0  # the longest stop() waits for its loops
COUNTS_EVERY_S = 0.5  # the longest a replica's counts wait for a sample to travel with

# ARGV: p, branch ('' none), last ('1'/'0'), t, e2e, uncached, cached, output, gap_ttl_s, maxlen, replica,
#       ttft ('' unknown)
FINISH = """
local p, branch, last = ARGV[1], ARGV[2], ARGV[3]
local t, e2e = tonumber(ARGV[4]), tonumber(ARGV[5])
local gap = ''
if branch ~= '' then
  local k = p..':gap:'..branch
  local prev = redis.call('GET', k)
  if prev then gap = string.format('%.6f', math.max(0, t - tonumber(prev))) end
  if last == '1' then
    redis.call('DEL', k)
  else
    redis.call('SET', k, string.format('%.6f', t + e2e), 'EX', ARGV[9])
  end
end
return redis.call('XADD', p..':workload', 'MAXLEN', '~', ARGV[10], '*',
  't', ARGV[4], 'e', ARGV[5], 'u', ARGV[6], 'c', ARGV[7], 'o', ARGV[8], 'g', gap, 'r', ARGV[11], 'f', ARGV[12])
"""


@dataclasses.dataclass(frozen=True)
class _Finished:
    sample: RequestSample
    branch: str | None
    last: bool


def decode_sample(fields: dict[str, str]) -> RequestSample:
    """One stream entry back into a `RequestSample`."""
    gap = fields.get("g", "")
    e2e = fields.get("e", "")
    ttft = fields.get("f", "")  # absent in entries written before TTFT was carried
    return RequestSample(
        t=float(fields["t"]),
        uncached_prompt_tokens=int(fields["u"]),
        cached_prompt_tokens=int(fields["c"]),
        output_tokens=int(fields["o"]),
        e2e_s=float(e2e) if e2e != "" else None,
        gap_s=float(gap) if gap != "" else None,
        ttft_s=float(ttft) if ttft != "" else None,
    )


class RedisWorkloadFeed:
    """`WorkloadFeed` shared by every replica (module docstring)."""

    def __init__(
        self,
        client: aioredis.Redis,
        prefix: str,
        replica: str,
        *,
        gap_ttl_s: float = 1800.0,
        history_s: float = 600.0,
        max_samples: int = 100_000,
        batch: int = 500,
        retry_s: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._r = client
        self._p = prefix
        self.replica = replica
        self._gap_ttl = max(1, int(gap_ttl_s))
        self._history_s = history_s
        self._maxlen = max_samples
        self._batch = batch
        self._retry_s = retry_s
        self._clock = clock
        self._script = client.register_script(FINISH)
        self._outbox: collections.deque[_Finished] = collections.deque(maxlen=max_samples)
        self._inbox: collections.deque[RequestSample] = collections.deque(maxlen=max_samples)
        self._local_gaps = TurnGaps()  # only while Redis is unreachable
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = asyncio.Event()  # set: stop() is under way (a cancel alone can be swallowed)
        self.last_id = ""
        self.sent = 0
        self.received = 0
        self.kept_local = 0  # samples kept on this replica only (Redis unreachable)
        self._unsent = [0, 0]  # this replica's (arrived, rejected) not yet added in Redis
        self._totals = [0, 0]  # the cluster's (arrived, rejected) as last read
        self._answered = (0, 0)

    # -- WorkloadFeed ---------------------------------------------------------------
    def add(self, sample: RequestSample, *, branch: str | None = None, last_in_branch: bool = False) -> None:
        self._outbox.append(_Finished(sample, branch, last_in_branch))
        self._wake.set()

    def drain(self) -> list[RequestSample]:
        out = list(self._inbox)
        self._inbox.clear()
        return out

    def peek(self) -> list[RequestSample]:
        return list(self._inbox)

    def count_arrival(self) -> None:
        self._unsent[0] += 1  # sent with the next sample, or by the writer's tick

    def count_rejection(self) -> None:
        self._unsent[1] += 1

    def counts(self) -> tuple[int, int]:
        now = (self._totals[0] + self._unsent[0], self._totals[1] + self._unsent[1])
        self._answered = (max(self._answered[0], now[0]), max(self._answered[1], now[1]))
        return self._answered

    def _read_totals(self, arrived: bytes | str | int | None, rejected: bytes | str | int | None) -> None:
        self._totals = [int(arrived or 0), int(rejected or 0)]

    # -- background -----------------------------------------------------------------
    async def start(self) -> None:
        if self._tasks:
            return
        self.last_id = f"{int(max(0.0, self._clock() - self._history_s) * 1000)}-0"
        self._stopping.clear()
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._write_loop(), name="workload-writer"),
            loop.create_task(self._read_loop(), name="workload-reader"),
        ]

    async def stop(self) -> None:
        # A cancel that lands as redis-py's socket timeout fires can come out
        # as a TimeoutError (a RedisError the loops retry on): the flag ends
        # them, and stop() never waits on a loop for ever.
        self._stopping.set()
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=STOP_TIMEOUT_S)
            if pending:
                log.warning("workload stream: %d loops did not stop within %.0f s", len(pending), STOP_TIMEOUT_S)
        self._tasks = []
        with contextlib.suppress(RedisError, OSError):
            await self.flush()

    async def flush(self) -> int:
        """Send what is queued now (one round trip; two after Redis lost its
        script: `_send`); returns how many went."""
        batch = [self._outbox.popleft() for _ in range(min(self._batch, len(self._outbox)))]
        counted = tuple(self._unsent)
        if not batch and not any(counted):
            return 0
        self._unsent = [0, 0]
        try:
            replies = await self._send(counted, [self._finish_args(f) for f in batch])
        except (RedisError, OSError):
            self._count_again(counted)
            self._keep_local(batch)
            raise
        if isinstance(replies[0], Exception) or isinstance(replies[1], Exception):
            self._count_again(counted)
        else:
            self._read_totals(replies[0], replies[1])
        refused = [(f, r) for f, r in zip(batch, replies[2:], strict=True) if isinstance(r, Exception)]
        if refused:  # each row ran alone: those that went are in the stream, these stay here
            log.warning(
                "workload stream: Redis refused %d samples (%s): kept on this replica", len(refused), refused[0][1]
            )
            self._keep_local([f for f, _ in refused])
        self.sent += len(batch) - len(refused)
        return len(batch)

    def _count_again(self, counted: tuple[int, ...]) -> None:
        """Counts that did not reach Redis go with the next flush."""
        self._unsent = [self._unsent[0] + counted[0], self._unsent[1] + counted[1]]

    def _finish_args(self, f: _Finished) -> list[str | int]:
        s = f.sample
        return [
            self._p,
            f.branch or "",
            "1" if f.last else "0",
            repr(float(s.t)),
            repr(float(s.e2e_s or 0.0)),
            s.uncached_prompt_tokens,
            s.cached_prompt_tokens,
            s.output_tokens,
            self._gap_ttl,
            self._maxlen,
            self.replica,
            "" if s.ttft_s is None else repr(float(s.ttft_s)),
        ]

    async def _send(self, counted: tuple[int, ...], rows: list[list[str | int]]) -> list[Any]:
        """Both counters and one FINISH per row in one pipeline; the replies,
        a failed command's as its exception. The script goes by its SHA
        (redis-py's script objects ask SCRIPT EXISTS before every pipeline:
        a round trip per flush); rows a Redis that lost its scripts refused
        (NOSCRIPT: nothing of them ran) go again once it is loaded, and
        come back refused when that fails too."""
        pipe = self._r.pipeline(transaction=False)
        pipe.incrby(f"{self._p}:arrived", counted[0])
        pipe.incrby(f"{self._p}:rejected", counted[1])
        for args in rows:
            pipe.evalsha(self._script.sha, 0, *args)
        replies: list[Any] = await pipe.execute(raise_on_error=False)
        lost = [i for i, r in enumerate(replies) if isinstance(r, NoScriptError)]
        if lost:
            again: list[Any]
            try:
                await self._r.script_load(FINISH)
                pipe = self._r.pipeline(transaction=False)
                for i in lost:
                    pipe.evalsha(self._script.sha, 0, *rows[i - 2])
                again = await pipe.execute(raise_on_error=False)
            except (RedisError, OSError) as exc:  # the counts and the other rows went: only these are refused
                again = [exc] * len(lost)
            for i, r in zip(lost, again, strict=True):
                replies[i] = r
        return replies

    def _keep_local(self, batch: list[_Finished]) -> None:
        """Redis unreachable: this replica's planner gets its own samples."""
        for f in batch:
            s = f.sample
            if f.branch is not None:
                finish = s.t + (s.e2e_s or 0.0)
                s = dataclasses.replace(s, gap_s=self._local_gaps.finished(f.branch, s.t, finish, f.last))
            self._inbox.append(s)
        self.kept_local += len(batch)

    async def _write_loop(self) -> None:
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(COUNTS_EVERY_S):  # counts alone go out at this tick
                    await self._wake.wait()
            self._wake.clear()
            while (self._outbox or any(self._unsent)) and not self._stopping.is_set():
                try:
                    await self.flush()
                except (RedisError, OSError) as exc:
                    if self._stopping.is_set():
                        return
                    log.warning("workload stream unreachable (%s): keeping samples on this replica", exc)
                    await asyncio.sleep(self._retry_s)

    async def _read_loop(self) -> None:
        key = f"{self._p}:workload"
        while not self._stopping.is_set():
            try:
                reply: Any = await self._r.xread({key: self.last_id}, count=1000, block=500)
                self._read_totals(*await self._r.mget(f"{self._p}:arrived", f"{self._p}:rejected"))
            except (RedisError, OSError) as exc:
                if self._stopping.is_set():
                    return
                log.warning("workload stream unreadable (%s); retrying", exc)
                await asyncio.sleep(self._retry_s)
                continue
            for _, entries in reply or []:
                for entry_id, fields in entries:
                    self.last_id = entry_id
                    try:
                        self._inbox.append(decode_sample(fields))
                        self.received += 1
                    except (KeyError, ValueError):
                        log.warning("malformed workload entry %s skipped", entry_id)
