"""Shared fixtures for the store's integration tests (SQLite and PostgreSQL).

Not a conftest: test modules import what they use, e.g.
`from tests.integration.conftest_store import store_url, migrated_db`.
PostgreSQL tests (marked `postgres`) each create and drop a uniquely named
database on 127.0.0.1:5432 and are skipped when the server is not there.
"""

from __future__ import annotations

import contextlib
import pathlib
import uuid
from typing import Iterator

import pytest

from gateway.store.migrate import db_upgrade
from gateway.store.db import Database

PG_ADMIN_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres connect_timeout=3"
PG_URL = "postgresql+psycopg://postgres@{host}:{port}/{name}"


def pg_available() -> bool:
    import psycopg

    try:
        with psycopg.connect(PG_ADMIN_DSN):
            return True
    except psycopg.OperationalError:
        return False


def pg_admin(sql: str) -> None:
    """Run one statement on the maintenance database (autocommit)."""
    import psycopg

    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
        conn.execute(sql)  # type: ignore[arg-type]


@contextlib.contextmanager
def pg_database() -> Iterator[str]:
    """A fresh database; yields its name; drops it (forcing out sessions) after."""
    if not pg_available():
        pytest.skip("PostgreSQL is not reachable on 127.0.0.1:5432")
    name = f"ei_test_{uuid.uuid4().hex[:12]}"
    pg_admin(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        pg_admin(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> Iterator[str]:
    """An empty database URL on each backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
        return
    with pg_database() as name:
        yield PG_URL.format(host="127.0.0.1", port=5432, name=name)


@pytest.fixture
def migrated_db(store_url: str) -> Iterator[Database]:
    """A `Database` on a fully migrated store (both backends)."""
    db_upgrade(store_url)
    db = Database(store_url, pepper="test-pepper")
    try:
        yield db
    finally:
        db.dispose()


@pytest.fixture
def sqlite_db(tmp_path: pathlib.Path) -> Iterator[Database]:
    """A migrated SQLite store only (fast tests that need no backend coverage)."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    db_upgrade(url)
    db = Database(url, pepper="test-pepper")
    try:
        yield db
    finally:
        db.dispose()
