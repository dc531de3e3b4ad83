"""Schema management for the store: `evolving-infra db upgrade|downgrade`.

The Alembic configuration is built in code from the installed `migrations`
package, so it works from a wheel as well as from a checkout.
"""

from __future__ import annotations

import pathlib

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
import sqlalchemy as sa

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


def db_upgrade(url: str | None = None, rev: str = "head") -> None:
    """Migrate the database at `url` (default: the embedded SQLite file) up to `rev`."""
    command.upgrade(alembic_config(url), rev)


def db_downgrade(url: str | None, rev: str) -> None:
    """Migrate down to `rev` (`base` drops every table of the store)."""
    command.downgrade(alembic_config(url), rev)


def db_revision(url: str | None = None) -> str | None:
    """The revision the database is at (None: never migrated)."""
    engine = sa.create_engine(url or DEFAULT_URL, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()
