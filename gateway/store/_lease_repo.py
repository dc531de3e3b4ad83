"""The planner leadership lease in the store: claim, renew, release.

Keyword-only, take a session, never commit. Times are the **database's**
clock (PostgreSQL `clock_timestamp()`, SQLite `julianday('now')`), so
replicas whose clocks disagree still agree on when a lease expires. One
conditional UPDATE per claim makes it atomic on both backends: of two
replicas racing for an expired lease exactly one matches the row.
See `gateway.control.lease` for what a replica does with the answer.
"""

from __future__ import annotations

from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.orm import Session

from gateway.store.records import LeaseRecord
from gateway.store.tables import LeaderLease

PLANNER_LEASE = "planner"


def _db_now(session: Session) -> sa.ColumnElement[float]:
    """The database clock as unix seconds (a SQL expression)."""
    if session.get_bind().dialect.name == "postgresql":
        return sa.cast(sa.func.extract("epoch", sa.func.clock_timestamp()), sa.Float)
    return (sa.func.julianday("now") - 2440587.5) * 86400.0


def read_lease(session: Session, *, name: str = PLANNER_LEASE) -> LeaseRecord:
    now = _db_now(session)
    row = session.execute(
        sa.select(LeaderLease.holder, LeaderLease.term, LeaderLease.expires_at - now).where(LeaderLease.name == name)
    ).one_or_none()
    if row is None:
        return LeaseRecord(holder="", term=0, expires_in_s=0.0)
    return LeaseRecord(holder=row[0], term=int(row[1]), expires_in_s=float(row[2]))


def claim_lease(
    session: Session, *, holder: str, ttl_s: float, held_term: int | None, name: str = PLANNER_LEASE
) -> LeaseRecord:
    """Renew the lease if `holder` holds it at `held_term`, else take it if it
    has expired (term + 1); either way return the row as it now stands.

    On PostgreSQL the claim's transaction waits for the row's lock at most
    `ttl_s`, and the server ends its session if it sits idle inside it for
    `ttl_s`: a replica stopped between the UPDATE and the COMMIT (SIGSTOP, a
    frozen VM) would otherwise hold the row, and every follower's claim
    with it, for as long as it is stopped. Both settings end with the
    transaction."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(  # SET LOCAL as one bound round trip
            sa.text(
                "SELECT set_config('lock_timeout', :ms, true),"
                " set_config('idle_in_transaction_session_timeout', :ms, true)"
            ),
            {"ms": str(max(1, int(ttl_s * 1000)))},
        )
    now = _db_now(session)
    t = LeaderLease.__table__.c
    mine = sa.and_(t.holder == holder, t.term == held_term) if held_term is not None else sa.false()
    session.execute(
        sa.update(LeaderLease)
        .where(t.name == name, sa.or_(mine, t.expires_at <= now))
        .values(
            holder=holder,
            term=sa.case((mine, t.term), else_=t.term + 1),
            expires_at=now + ttl_s,
            renewed_at=now,
        )
        .execution_options(synchronize_session=False)
    )
    return read_lease(session, name=name)


def release_lease(session: Session, *, holder: str, term: int, name: str = PLANNER_LEASE) -> bool:
    """Give the lease up now (a clean stop): True if `holder` still held it."""
    t = LeaderLease.__table__.c
    result = session.execute(
        sa.update(LeaderLease)
        .where(t.name == name, t.holder == holder, t.term == term)
        .values(expires_at=_db_now(session))
        .execution_options(synchronize_session=False)
    )
    return bool(cast("sa.CursorResult[Any]", result).rowcount)  # an UPDATE's result is a CursorResult
