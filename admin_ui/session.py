"""Console settings and the per-browser-session login state.

`ConsoleSettings.from_env` is the only place the console reads the
environment; `app.py` calls it once per session and keeps the result in
`st.session_state`. Pages get the logged-in client and identity from here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import streamlit as st

from admin_ui.client import AdminClient, Identity

ADMIN_URL_ENV = "EVOLVING_ADMIN_URL"
REFRESH_ENV = "EVOLVING_CONSOLE_REFRESH_S"
DEFAULT_ADMIN_URL = "http://127.0.0.1:8000"

_SETTINGS = "console_settings"
_CLIENT = "console_client"
_IDENTITY = "console_identity"
_NOTICE = "console_login_notice"


@dataclass(frozen=True)
class ConsoleSettings:
    admin_url: str = DEFAULT_ADMIN_URL  # gateway base URL; the console appends /admin/...
    refresh_s: float = 5.0  # Cluster page auto-refresh period, seconds (1..3600)
    timeout_s: float = 10.0  # per admin API call

    def __post_init__(self) -> None:
        if not self.admin_url.startswith(("http://", "https://")):
            raise ValueError(f"{ADMIN_URL_ENV} must be an http(s) URL, got {self.admin_url!r}")
        if not 1.0 <= self.refresh_s <= 3600.0:
            raise ValueError(f"{REFRESH_ENV} must be between 1 and 3600 seconds, got {self.refresh_s}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ConsoleSettings:
        env = os.environ if environ is None else environ
        return cls(admin_url=env.get(ADMIN_URL_ENV) or DEFAULT_ADMIN_URL, refresh_s=float(env.get(REFRESH_ENV) or 5.0))


def settings() -> ConsoleSettings:
    if _SETTINGS not in st.session_state:
        st.session_state[_SETTINGS] = ConsoleSettings.from_env()
    value: ConsoleSettings = st.session_state[_SETTINGS]
    return value


def log_in(token: str) -> Identity:
    """Check the token against `/admin/whoami`; keep client and identity on success.

    Raises `AdminApiError` (bad token, unreachable API); nothing is kept then.
    """
    conf = settings()
    client = AdminClient(conf.admin_url, token.strip(), timeout_s=conf.timeout_s)
    try:
        identity = client.whoami()
    except Exception:
        client.close()
        raise
    st.session_state[_CLIENT] = client
    st.session_state[_IDENTITY] = identity
    return identity


def log_out(notice: str | None = None) -> None:
    """Forget the token; `notice` is shown once on the login page (e.g. why)."""
    if notice:
        st.session_state[_NOTICE] = notice
    client: AdminClient | None = st.session_state.pop(_CLIENT, None)
    st.session_state.pop(_IDENTITY, None)
    if client is not None:
        client.close()


def take_notice() -> str | None:
    value: str | None = st.session_state.pop(_NOTICE, None)
    return value


def identity() -> Identity | None:
    value: Identity | None = st.session_state.get(_IDENTITY)
    return value


def client() -> AdminClient:
    """The logged-in client; `app.py` shows pages only after a login."""
    value: AdminClient = st.session_state[_CLIENT]
    return value


def can_write() -> bool:
    who = identity()
    return who is not None and who.can_write
