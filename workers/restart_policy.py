"""When to restart what died: exponential backoff and a retry limit (pure).

`RestartPolicy` holds the numbers; `RestartBook.decide` turns one look at
something that may be down ("why it is down", or None) into "leave it",
"restart after d seconds" or "give up". The worker's own engine healer
(`workers.engine_heal`, an engine core restarted inside the live process)
and `up`'s watchdog (`cli.watchdog`, a whole worker process relaunched)
both use it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RestartPolicy:
    base_delay_s: float = 1.0  # before the first restart
    factor: float = 2.0  # each later restart within the window waits this much longer
    max_delay_s: float = 30.0
    max_restarts: int = 5  # within window_s; then it stays down (a person, or the next supervisor up, must look)
    window_s: float = 600.0

    def __post_init__(self) -> None:
        if self.base_delay_s < 0 or self.factor < 1 or self.max_delay_s < self.base_delay_s:
            raise ValueError("need 0 <= base_delay_s <= max_delay_s and factor >= 1")
        if self.max_restarts < 0 or self.window_s <= 0:
            raise ValueError("need max_restarts >= 0 and window_s > 0")

    def delay(self, attempt: int) -> float:
        """Seconds to wait before restart number `attempt` (1-based) within the window."""
        return min(self.max_delay_s, self.base_delay_s * self.factor ** max(0, attempt - 1))


@dataclass(frozen=True)
class Verdict:
    restart: bool
    delay_s: float = 0.0
    attempt: int = 0  # restarts within the window, this one included
    gave_up: bool = False


@dataclass
class RestartBook:
    """The restarts of one thing (times, unix s) and the rule over them."""

    policy: RestartPolicy
    times: list[float] = field(default_factory=list)
    gave_up: bool = False

    def decide(self, cause: str | None, now: float) -> Verdict:
        """`cause`: why it is down (None: it is fine)."""
        if cause is None or self.gave_up:
            return Verdict(restart=False)
        self.times = [t for t in self.times if now - t < self.policy.window_s]
        if len(self.times) >= self.policy.max_restarts:
            self.gave_up = True
            return Verdict(restart=False, gave_up=True, attempt=len(self.times))
        attempt = len(self.times) + 1
        self.times.append(now)
        return Verdict(restart=True, delay_s=self.policy.delay(attempt), attempt=attempt)
