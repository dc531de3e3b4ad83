"""Real databases for tests: a fresh PostgreSQL database per use (created and
dropped on 127.0.0.1:5432; skipped when the server is not there)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import pytest

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
        conn.execute(sql)


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
