"""The database of `bench chaos` and its outage fault.

`database(kind, workdir)` gives the store's URL: SQLite in `workdir` when
`kind` is "sqlite", or "auto" and PostgreSQL does not answer on
127.0.0.1:5432 (no outage window then); else a fresh PostgreSQL database,
dropped afterwards.
`db_outage(...)`: after `db_outage_at_s`, the PostgreSQL database refuses
connections for `db_outage_s` seconds (`ALTER DATABASE ... ALLOW_CONNECTIONS
false` + terminating its backends), then takes them again.
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

from bench._chaos_log import ChaosLog

if TYPE_CHECKING:
    from bench.chaos_bench import ChaosConfig

PG_ADMIN_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres connect_timeout=3"


def _pg(sql: str) -> None:
    import psycopg

    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as conn:
        conn.execute(sql)


def pg_available() -> bool:
    try:
        _pg("SELECT 1")
        return True
    except Exception:  # noqa: BLE001 - any failure means "not available"
        return False


@contextlib.contextmanager
def database(kind: str, workdir: pathlib.Path) -> Iterator[tuple[str, str | None]]:
    """(url, pg database name or None); a PostgreSQL database is dropped afterwards."""
    if kind == "sqlite" or (kind == "auto" and not pg_available()):
        yield f"sqlite:///{workdir / 'chaos.db'}", None
        return
    name = f"ei_chaos_{uuid.uuid4().hex[:10]}"
    _pg(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}", name
    finally:
        with contextlib.suppress(Exception):
            _pg(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
            _pg(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def cut_database(name: str) -> None:
    _pg(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
    _pg(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'")


def restore_database(name: str) -> None:
    _pg(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')


async def db_outage(pg_name: str | None, cfg: ChaosConfig, log: ChaosLog) -> None:
    if pg_name is None or cfg.db_outage_s <= 0:
        return
    await asyncio.sleep(cfg.db_outage_at_s)
    t0 = time.monotonic()
    await asyncio.to_thread(cut_database, pg_name)
    try:
        await asyncio.sleep(cfg.db_outage_s)
    finally:
        await asyncio.to_thread(restore_database, pg_name)
        log.db_outage_s = round(time.monotonic() - t0, 1)
