"""The control-plane store: SQLAlchemy tables, repository functions, and the
buffered `EventSink` that keeps serving when the database is down.

Public API: `Database`, `EventSink`, `SinkConfig`, `repository`, and the
boundary records in `records` (`Policy`, `KeyGrant`, `Overrides`).
"""

from gateway.store.db import DEFAULT_URL, Database, StoreUnavailable
from gateway.store.records import KeyGrant, Overrides, Policy
from gateway.store.sink import EventSink, SinkConfig, SinkStats

__all__ = [
    "DEFAULT_URL",
    "Database",
    "StoreUnavailable",
    "EventSink",
    "SinkConfig",
    "SinkStats",
    "KeyGrant",
    "Overrides",
    "Policy",
]
