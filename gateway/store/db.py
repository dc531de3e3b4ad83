"""`Database`: one engine and a session factory for a SQLAlchemy URL.

SQLite (the embedded default) and PostgreSQL (`postgresql+psycopg://...`) are
supported. Connections fail fast (`connect_timeout_s`) so that an unreachable
database turns into `StoreUnavailable` quickly instead of hanging a caller.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.orm import Session, sessionmaker

from gateway.http import errors

DEFAULT_URL = "sqlite:///evolving-infra.db"
T = TypeVar("T")


class StoreUnavailable(errors.Unavailable):
    """The database could not be reached (or dropped the connection)."""

    code = "store_unavailable"


def is_connectivity_error(exc: BaseException) -> bool:
    """True for failures that retrying later may cure (server down, link lost)."""
    if isinstance(exc, (sa_exc.OperationalError, sa_exc.InterfaceError, sa_exc.TimeoutError)):
        return True
    return isinstance(exc, sa_exc.DBAPIError) and bool(exc.connection_invalidated)


def _engine_kwargs(url: sa.URL, connect_timeout_s: float) -> dict[str, Any]:
    if url.get_backend_name() == "sqlite":
        return {"connect_args": {"check_same_thread": False, "timeout": 30}}
    kwargs: dict[str, Any] = {"pool_pre_ping": True, "pool_timeout": connect_timeout_s}
    if url.get_backend_name() == "postgresql":
        kwargs["connect_args"] = {"connect_timeout": max(1, int(connect_timeout_s))}
    return kwargs


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


class Database:
    """Engine + sessions for one URL. Build it at startup; it connects lazily.

    `pepper` is the server-side secret mixed into key and token hashes; every
    component that creates or verifies secrets reads it from here.
    """

    def __init__(self, url: str, *, pepper: str = "", connect_timeout_s: float = 5.0, echo: bool = False) -> None:
        self.url = sa.make_url(url)
        self.pepper = pepper
        self.engine = sa.create_engine(self.url, echo=echo, **_engine_kwargs(self.url, connect_timeout_s))
        if self.url.get_backend_name() == "sqlite":
            sa.event.listen(self.engine, "connect", _sqlite_pragmas)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @contextlib.contextmanager
    def session(self) -> Iterator[Session]:
        """A session in one transaction: committed on success, rolled back on error.

        Connectivity failures surface as `StoreUnavailable`; other database
        errors propagate unchanged.
        """
        session = self._sessions()
        try:
            yield session
            session.commit()
        except sa_exc.SQLAlchemyError as exc:
            with contextlib.suppress(sa_exc.SQLAlchemyError):  # the link may be gone already
                session.rollback()
            if is_connectivity_error(exc):
                raise StoreUnavailable("The control-plane database is unreachable.") from exc
            raise
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    def run(self, fn: Callable[[Session], T]) -> T:
        """Run `fn(session)` in one transaction (blocking)."""
        with self.session() as session:
            return fn(session)

    async def run_async(self, fn: Callable[[Session], T]) -> T:
        """Run `fn(session)` in a worker thread so the event loop never blocks on I/O."""
        return await asyncio.to_thread(self.run, fn)

    def dispose(self) -> None:
        self.engine.dispose()
