"""Every model move checked against what it delivered.

A move is made on a prediction: the target split serves ``predicted``
more (a fraction of the current split's throughput, or of its mean
response time for a latency move), give or take ``predicted_sd``. Once
the switch has settled (no node draining), the requests that were running
then have had one mean response time to finish (the larger of the mean
measured before the move and that of the requests finished since the
switch settled: until then the finish rate is the old split's; a
reasoning decode of two minutes on the new split shows in it only after
two minutes; and early in a run the mean before counts only the requests
short enough to have finished: DeepSeek-R1 with doubled outputs, 3P -> 1P
at 160 s on a measured 54 s, was judged at 280 s on a finish rate still
climbing, +8.7 % of a predicted +33 %, and reverted; judged once the
longer responses after it had had their time, +18.9 %, kept), and
``settle_s`` more of traffic has finished, the same quantity is measured:
the finish rate (or the mean response time) over that last span against
the span of the same length before the move. The move **delivered** when

    realized ≥ predicted − z · sqrt(predicted_sd² + measured_sd²),

the gate the move itself passed, read from the other side: the outcome
lies within the model's own uncertainty plus what counting finished
requests adds: a finish count's variance is at least Poisson's (n), and
as large as the tick-to-tick scatter says when traffic comes in bursts
(agent sessions start together, sub-agents fan out): the count over a
span of k ticks varies by k times the variance of one tick's count. A move that
did not deliver and shows no gain beyond its measurement noise
(``realized − z · measured_sd ≤ 0``) is **reverted**: it spent a switch
for nothing measurable, and the split it left was measured to serve as
well. A move that gained less than predicted but still gained is kept,
and so is a latency move whose finish rate rose beyond its noise: served
throughput comes first in the planner's objective (response time only
decides between splits that serve the same), so more served is a gain
whatever the responses say. The other way round, a latency move whose
finish rate fell beyond its noise did not deliver, however much shorter
the responses measured, and is reverted: it promised the same
throughput, and when fewer requests finish, the ones that do are the
short ones (the long ones are still waiting), so the responses measured
shorten by themselves (Mooncake synthetic near from its best split 8P:
8P -> 7P for a predicted 24 % shorter response measured 30 % shorter,
with the finish rate down from 22.7 to 18.0 req/s and the prefill queue
growing); its miss is its whole predicted gain. Early in a run the responses cannot say
much: only requests shorter than the history can have finished, so the
mean response of the finished ones climbs with time whatever the split
(DeepSeek-R1 near, 3P -> 1P at 190 s, a latency move: responses measured
48 % longer, the finish rate 33 % higher; reverting it cost 900 s at the
old split before a throughput move made the same switch).
An SLO repair is checked and its miss counted, but reverted only when
it broke its own promise: it was made because the split it left broke the
TTFT (or TPOT) bound, and it was allowed only at a predicted throughput
cost of at most ``repair_tolerance`` (the planner's tie band), so its
purpose is the bound, not a gain in the finish rate; a revert on a mere
miss would put the split back outside the bound and the planner would
repair it again once the flap window passed (OpenCode near from 1P: 1P ->
2P for TTFT at 250 s, reverted at 320 s on a finish rate 3 % lower with
4 % fewer arrivals, repaired again at 970 s). But a repair whose finish
rate fell by more than its tolerance beyond the measurement noise
(``realized + z · measured_sd < −repair_tolerance``) cost what it was
allowed not to, and is reverted like any move that did not deliver:
under overload no split meets the TTFT bound, and the model's capacity
of the split it has not measured is the one that errs (OpenCode near at
3x its load, 3P -> 4P for TTFT with 1 % more predicted; 4P served 18 %
less, and the repair stood for 600 s until the objective undid it). Its
miss, counted against later throughput gains, keeps the planner from
repairing again while it lasts.

Either way a miss (predicted − realized, when the move did not deliver)
is the model's **verified error** on this workload: later gains of the
same kind are counted net of it (``error``) until it decays with a
half-life of ``error_half_life_s`` (the planner's ``horizon_s``: a move's
gain is counted over that horizon, so an error older than one horizon
speaks about traffic the next decision will not see). The planner then
learns how wrong it is, instead of repeating the move.

The split the planner stands on is checked too, on every tick the
model decides from (``standing``): the mean response the model gives it
against the mean measured over the last ``settle_s`` on it (no switch in
that span, no move awaiting its check). A latency gain is a relative
difference of two modelled responses, so a model that misses the one
response it can measure, the current split's, by a fraction e beyond
the noise of both (z standard errors of the measured mean plus the
model's own sd) cannot rank two splits by less than e: that miss, |R
model − R measured| / the larger of the two, is counted as a latency
miss like a move's, and decays the same way. Staying put then wins
until a latency gain clears its bound net of the error the planner saw
where it stands, without paying a move to learn it (Mooncake synthetic
near at its best split, 8P: the model put 8P's mean response at 3-6 s
from 530 s to 950 s while the finished requests measured 23-68 s (the
prefill queue reached 105 per node); at 1,100 s the model, matching the
measurement again, put 7P 18 % faster and moved, and the move lowered
the finish rate from 22.7 to 18.0 req/s and was reverted; the miss of
those minutes, decayed, is larger than the 18 %).

Early moves (before the planner's ``min_history_s``) are taken on queues,
not on a prediction, and are not checked here; a revert is not checked
either (it returns to a split that was measured).

Pure: the planner feeds one ``TickCounts`` per tick.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, replace
from typing import Literal

Kind = Literal["throughput", "latency"]


@dataclass(frozen=True)
class VerifyConfig:
    """settle_s: traffic measured on the new split once the switch has
        settled, and on the old one before the move (> 0; None: the
        planner's ``persist_s``): a move is judged on as much evidence as
        it was made on.
    min_requests: finished requests each span needs for a verdict (≥ 1);
        with fewer the move is left unjudged (a Poisson count of 20 has a
        relative sd of 22 %, wider than any gain the planner acts on).
    max_wait_s: a move not judged this long after it was made (a switch
        that never settles, no traffic) is dropped unjudged (> settle_s).
    error_half_life_s: half-life of a verified error (> 0; None: the
        planner's ``horizon_s``, module doc).
    revert: revert moves that did not deliver (module doc); False = only
        record the verdict and widen the error band.
    """

    settle_s: float | None = None
    min_requests: int = 20
    max_wait_s: float = 600.0
    error_half_life_s: float | None = None
    revert: bool = True

    def __post_init__(self) -> None:
        if (self.settle_s is not None and self.settle_s <= 0) or self.min_requests < 1:
            raise ValueError("settle_s must be > 0 and min_requests >= 1")
        if self.error_half_life_s is not None and self.error_half_life_s <= 0:
            raise ValueError("error_half_life_s must be > 0")
        if self.settle_s is not None and self.max_wait_s <= self.settle_s:
            raise ValueError("max_wait_s must exceed settle_s")

    def resolved(self, persist_s: float, horizon_s: float) -> VerifyConfig:
        """The config with the planner's spans filled in where None."""
        settle = persist_s if self.settle_s is None else self.settle_s
        half = horizon_s if self.error_half_life_s is None else self.error_half_life_s
        return replace(self, settle_s=settle, error_half_life_s=half, max_wait_s=max(self.max_wait_s, 2 * settle))


@dataclass(frozen=True)
class TickCounts:
    """What finished between two ticks, and the queues at the tick."""

    t: float
    finished: int
    e2e_sum_s: float = 0.0  # over the finished requests that report e2e
    e2e_sq_sum_s: float = 0.0
    e2e_n: int = 0
    waiting: float = 0.0  # requests waiting on every node at the tick


@dataclass(frozen=True)
class Span:
    """Finish rate and response time measured over one span."""

    seconds: float
    finished: int
    e2e_mean_s: float
    e2e_sd_s: float
    e2e_n: int
    queue_slope: float  # waiting requests per second, last tick minus first over the span
    finished_var: float = 0.0  # variance of ``finished``: max(Poisson, k ticks x one tick's scatter)

    @property
    def rate(self) -> float:
        return self.finished / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class PendingMove:
    t: float
    from_prefill: int
    to_prefill: int
    kind: Kind
    predicted: float  # gain fraction on means (throughput: X(T)/X(C) − 1; latency: 1 − R(T)/R(C))
    predicted_sd: float  # its standard deviation, same units
    before: Span
    repair_tolerance: float | None = None  # an SLO repair: the throughput cost it was allowed (module doc)


@dataclass(frozen=True)
class Verdict:
    """The check of one move (stored with the decision that makes it)."""

    move: PendingMove
    realized: float  # same units as ``move.predicted``
    measured_sd: float
    delivered: bool
    revert: bool
    after: Span

    def inputs(self) -> dict[str, float]:
        """Plain numbers for ``Decision.inputs`` (the console reads these keys)."""
        m = self.move
        return {
            "verified_move_t": m.t,
            "verified_from_prefill": float(m.from_prefill),
            "verified_to_prefill": float(m.to_prefill),
            "verified_latency": float(m.kind == "latency"),
            "predicted_gain_frac": m.predicted,
            "predicted_gain_sd_frac": m.predicted_sd,
            "realized_gain_frac": self.realized,
            "realized_gain_sd_frac": self.measured_sd,
            "move_delivered": float(self.delivered),
            "move_reverted": float(self.revert),
            "rate_before_rps": m.before.rate,
            "rate_after_rps": self.after.rate,
            "queue_slope_before": m.before.queue_slope,
            "queue_slope_after": self.after.queue_slope,
        }


class MoveVerifier:
    """Tick ledger, the move awaiting its check, and the verified errors."""

    def __init__(self, config: VerifyConfig, z: float, retention_s: float) -> None:
        if config.settle_s is None or config.error_half_life_s is None:
            raise ValueError("resolve settle_s and error_half_life_s first (VerifyConfig.resolved)")
        self.config = config
        self.settle_s, self.half_life_s = config.settle_s, config.error_half_life_s
        self.z = z
        self.retention_s = max(retention_s, config.max_wait_s + self.settle_s)
        self._ticks: deque[TickCounts] = deque()
        self.pending: PendingMove | None = None
        self._settled_t: float | None = None
        self._drained = False  # a node of the awaited move was seen draining
        self._misses: list[tuple[float, Kind, float]] = []  # (t, kind, miss fraction)
        self.verdicts = 0
        self.reverts = 0

    def add(self, tick: TickCounts) -> None:
        """One tick's counts; a second call at the same time adds to the first."""
        last = self._ticks[-1] if self._ticks else None
        if last is not None and tick.t <= last.t:
            tick = TickCounts(
                last.t,
                last.finished + tick.finished,
                last.e2e_sum_s + tick.e2e_sum_s,
                last.e2e_sq_sum_s + tick.e2e_sq_sum_s,
                last.e2e_n + tick.e2e_n,
                tick.waiting,
            )
            self._ticks.pop()
        self._ticks.append(tick)
        while self._ticks and self._ticks[0].t < tick.t - self.retention_s:
            self._ticks.popleft()

    def span(self, start: float, end: float) -> Span:
        """Ticks in (start, end]: what finished in that span."""
        ticks = [x for x in self._ticks if start < x.t <= end]
        n = sum(x.finished for x in ticks)
        en = sum(x.e2e_n for x in ticks)
        s1 = sum(x.e2e_sum_s for x in ticks)
        s2 = sum(x.e2e_sq_sum_s for x in ticks)
        mean = s1 / en if en else 0.0
        sd = math.sqrt(max(s2 / en - mean * mean, 0.0)) if en else 0.0
        dt = ticks[-1].t - ticks[0].t if ticks else 0.0
        slope = (ticks[-1].waiting - ticks[0].waiting) / dt if dt > 0 else 0.0
        counts = [x.finished for x in ticks]
        k = len(counts)
        scatter = k * sum((c - n / k) ** 2 for c in counts) / (k - 1) if k > 1 else 0.0
        return Span(end - start, n, mean, sd, en, slope, max(float(n), scatter))

    def start(
        self,
        now: float,
        from_p: int,
        to_p: int,
        kind: Kind,
        predicted: float,
        predicted_sd: float,
        *,
        repair_tolerance: float | None = None,
    ) -> bool:
        """Await the check of a move made at ``now``; False (nothing awaited)
        when the span before it holds too few requests to compare with.
        ``repair_tolerance``: the move is an SLO repair allowed that much
        throughput cost (module doc); None: an ordinary move."""
        before = self.span(now - self.settle_s, now)
        self.pending, self._settled_t, self._drained = None, None, False
        if before.finished < self.config.min_requests or not math.isfinite(predicted):
            return False
        self.pending = PendingMove(now, from_p, to_p, kind, predicted, max(predicted_sd, 0.0), before, repair_tolerance)
        return True

    def check(self, now: float, draining: bool, prefill_now: int) -> Verdict | None:
        """The verdict on the awaited move once its span has been measured
        (module doc), else None. Drops a move that cannot be judged."""
        m = self.pending
        if m is None:
            return None
        if (prefill_now != m.to_prefill and not draining) or now - m.t > self.config.max_wait_s:
            self.pending, self._settled_t = None, None  # split changed by other hands, or never settled
            return None
        if draining:
            self._settled_t, self._drained = None, True
            return None
        if self._settled_t is None:
            # The first tick with no node draining; a switch done before the tick after the move counts from the move.
            self._settled_t = now if self._drained else m.t
        since = self.span(self._settled_t, now)
        lag = min(max(m.before.e2e_mean_s, since.e2e_mean_s), self.config.max_wait_s - self.settle_s)
        if now - self._settled_t < self.settle_s + lag:
            return None
        after = self.span(now - self.settle_s, now)
        self.pending, self._settled_t = None, None
        if after.finished < self.config.min_requests:
            return None
        realized, sd = _realized(m, after)
        bound = m.predicted - self.z * math.hypot(m.predicted_sd, sd)
        delivered = realized >= bound
        if m.repair_tolerance is None:
            nothing_gained = realized - self.z * sd <= 0.0  # no gain beyond the noise
        else:  # an SLO repair: a loss beyond the noise and what it was allowed
            nothing_gained = realized + self.z * sd < -m.repair_tolerance
        revert = self.config.revert and not delivered and nothing_gained
        miss = m.predicted - realized
        if m.kind == "latency":
            served, served_sd = _realized(replace(m, kind="throughput"), after)
            if served + self.z * served_sd < 0.0:  # fewer finish: the shorter responses are the survivors'
                delivered, miss = False, m.predicted
                revert = self.config.revert
            elif revert:
                revert = served - self.z * served_sd <= 0.0  # more served is a gain, whatever the responses say
        if not delivered:
            self._misses.append((now, m.kind, miss))
        self.verdicts += 1
        self.reverts += int(revert)
        return Verdict(m, realized, sd, delivered, revert, after)

    def standing(self, now: float, model_s: float, model_sd_s: float, last_switch_t: float | None) -> float | None:
        """Check the model's mean response at the split the planner stands
        on against the span measured on it (module doc); the miss fraction
        (0: within the noise), or None when there is nothing to check with
        (a move awaiting its check, a switch within the span, too few
        finished, or a model response that is not finite)."""
        if self.pending is not None or not math.isfinite(model_s) or model_s <= 0:
            return None
        if last_switch_t is not None and last_switch_t > now - self.settle_s:
            return None
        sp = self.span(now - self.settle_s, now)
        if sp.e2e_n < self.config.min_requests or sp.e2e_mean_s <= 0:
            return None
        noise = self.z * (sp.e2e_sd_s / math.sqrt(sp.e2e_n) + max(model_sd_s, 0.0))
        gap = abs(model_s - sp.e2e_mean_s)
        if gap <= noise:
            return 0.0
        miss = gap / max(model_s, sp.e2e_mean_s)
        if miss > self.error(now, "latency"):
            self._misses.append((now, "latency", miss))
        return miss

    def error(self, now: float, kind: Kind) -> float:
        """Verified error of ``kind`` moves at ``now``: the largest miss,
        each decayed by its age (module doc); 0 with none."""
        half = self.half_life_s
        self._misses = [x for x in self._misses if now - x[0] < 10 * half]
        return max((miss * 0.5 ** ((now - t) / half) for t, k, miss in self._misses if k == kind), default=0.0)


def _realized(m: PendingMove, after: Span) -> tuple[float, float]:
    """(realized gain fraction, its sd) in the move's units."""
    b = m.before
    if m.kind == "throughput":
        ratio = after.rate / b.rate if b.rate > 0 else 1.0
        rel_b = max(b.finished_var, 1.0) / max(b.finished, 1) ** 2
        rel_a = max(after.finished_var, 1.0) / max(after.finished, 1) ** 2
        return ratio - 1.0, ratio * math.sqrt(rel_a + rel_b)
    if b.e2e_n == 0 or after.e2e_n == 0 or b.e2e_mean_s <= 0:
        return 0.0, math.inf
    ratio = after.e2e_mean_s / b.e2e_mean_s
    rel_a = after.e2e_sd_s / max(after.e2e_mean_s, 1e-9) / math.sqrt(after.e2e_n)
    rel_b = b.e2e_sd_s / b.e2e_mean_s / math.sqrt(b.e2e_n)
    return 1.0 - ratio, ratio * math.hypot(rel_a, rel_b)
