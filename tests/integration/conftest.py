"""Fixtures of the integration tests: the store on each backend (SQLite,
and PostgreSQL when the server runs; those cases are marked `postgres`)."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest

from gateway.store.db import Database
from gateway.store.migrate import db_upgrade
from testing.stores import PG_URL, pg_database


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
