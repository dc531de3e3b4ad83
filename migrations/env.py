"""Alembic environment for the gateway store (online and offline modes).

The URL comes from the Alembic config (`sqlalchemy.url`, set by
`gateway.store.migrate`) or from an existing connection passed in
`config.attributes["connection"]`. SQLite runs in batch mode so later
migrations can alter tables.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import context

from gateway.store.tables import Base

config = context.config
target_metadata = Base.metadata


def _configure(**kwargs: Any) -> None:
    context.configure(target_metadata=target_metadata, compare_type=True, **kwargs)


def run_offline() -> None:
    url = config.get_main_option("sqlalchemy.url")
    _configure(url=url, literal_binds=True, render_as_batch=str(url).startswith("sqlite"))
    with context.begin_transaction():
        context.run_migrations()


def _run_on(connection: sa.Connection) -> None:
    _configure(connection=connection, render_as_batch=connection.dialect.name == "sqlite")
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run_on(connection)
        return
    engine = sa.create_engine(config.get_main_option("sqlalchemy.url") or "", poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            _run_on(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
