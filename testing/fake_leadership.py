"""A fake `gateway.control.ports.Leadership`: one replica that leads at a fixed term.

For tests whose gateway steers the session's shared vLLM workers without a
lease store. Those workers outlive each test's gateway and refuse orders
below the newest term they have seen (`workers.fence`), so the test asks the
cluster for that term and leads above it: `FixedTermLeader(cluster_term + 1)`.
"""

from __future__ import annotations

from gateway.control.ports import LeadershipStatus


class FixedTermLeader:
    def __init__(self, term: int, replica: str = "test-gateway") -> None:
        self.term, self.replica = term, replica
        self.deposals: list[str] = []  # why each refusal said a newer leader exists

    def is_leader(self) -> bool:
        return not self.deposals

    def order_term(self) -> int:
        return self.term

    def status(self) -> LeadershipStatus:
        leading = self.is_leader()
        return LeadershipStatus(
            replica=self.replica, leader=self.replica if leading else None, term=self.term, leading=leading
        )

    def deposed(self, newer_term: int | None = None, why: str = "") -> None:
        self.deposals.append(why or f"newer term {newer_term}")
