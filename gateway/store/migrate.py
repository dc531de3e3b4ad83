"""Schema management for the store: `evolving-infra db upgrade` (and the
`db_downgrade` / `db_revision` helpers, which have no CLI subcommand).

The Alembic configuration is built in code from the installed `migrations`
package, so it works from a wheel as well as from a checkout.

On PostgreSQL an upgrade or downgrade holds a session-level advisory lock
(`pg_advisory_lock(MIGRATION_LOCK_KEY)`) on the connection that runs the
migration, so several gateway replicas (or init containers) migrating the same
database at once run one after the other: the first migrates, the others wait
and then find the schema current. SQLite and other backends take no lock.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext

import migrations
from gateway.store.db import DEFAULT_URL


def alembic_config(url: str | None = None) -> Config:
    """Alembic config pointing at the packaged migrations and `url`."""
    here = pathlib.Path(migrations.__file__).resolve().parent
    config = Config()
    config.set_main_option("script_location", str(here))
    config.set_main_option("path_separator", "os")
    config.set_main_option("version_locations", str(here / "versions"))
    # ConfigParser interpolation: a literal % in a password must be doubled.
    config.set_main_option("sqlalchemy.url", (url or DEFAULT_URL).replace("%", "%%"))
    return config


# Fixed key of the migration lock (ASCII "evolvinf"); advisory locks are per database.
MIGRATION_LOCK_KEY = 0x65766F6C76696E66


def _migrate(url: str | None, run: Callable[[Config], None]) -> None:
    """Run an Alembic command on `url`; on PostgreSQL under the migration lock."""
    config = alembic_config(url)
    target = sa.engine.make_url(url or DEFAULT_URL)
    if target.get_backend_name() != "postgresql":
        run(config)
        return
    engine = sa.create_engine(target, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            # Session-level lock: it outlives the transaction it was taken in.
            # Commit that transaction so Alembic begins (and commits) its own
            # on this same connection, after the lock is held.
            conn.execute(sa.text("SELECT pg_advisory_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
            conn.commit()
            config.attributes["connection"] = conn
            run(config)
            conn.commit()
            conn.execute(sa.text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATION_LOCK_KEY})
            conn.commit()
            # On an error the connection closes (NullPool), which releases the lock too.
    finally:
        engine.dispose()


def db_upgrade(url: str | None = None, rev: str = "head") -> None:
    """Migrate the database at `url` (default: `DEFAULT_URL`, ./evolving-infra.db) up to `rev`.

    Safe to run concurrently against one PostgreSQL database (advisory lock).
    """
    _migrate(url, lambda config: command.upgrade(config, rev))


def db_downgrade(url: str | None, rev: str) -> None:
    """Migrate down to `rev` (`base` drops every table of the store)."""
    _migrate(url, lambda config: command.downgrade(config, rev))


def db_revision(url: str | None = None) -> str | None:
    """The revision the database is at (None: never migrated)."""
    engine = sa.create_engine(url or DEFAULT_URL, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()
