"""Shared page furniture: API calls that fail into `st.error`, and the
two-step confirm-then-act pattern every write control uses.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import streamlit as st

from admin_ui.client import JSON, AdminApiError
from admin_ui.session import can_write, log_out

T = TypeVar("T")

READ_ONLY_HELP = "Your token has the viewer role: you can look, not change."


def fetch(call: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
    """Run one admin API call; on failure show the readable message and return None.

    A 401 means the token was revoked (or the store forgot it): back to the
    login page, saying why.
    """
    try:
        return call(*args, **kwargs)
    except AdminApiError as exc:
        if exc.status == 401:
            log_out(notice=f"Logged out: {exc}")
            st.rerun()
        st.error(str(exc))
        return None


def confirmed_action(
    key: str, label: str, *, prompt: str, payload: JSON, run: Callable[[JSON], Any], disabled: bool = False
) -> None:
    """A write control in two steps: `label` asks, "Confirm" acts.

    The payload is captured when the operator first clicks, so what is
    confirmed is exactly what was shown. The call's result (or its error)
    stays on screen under the control until the next action.
    """
    pending_key, result_key = f"{key}__pending", f"{key}__result"
    writable = can_write() and not disabled
    if st.button(label, key=key, disabled=not writable, help=None if can_write() else READ_ONLY_HELP):
        st.session_state[pending_key] = {"prompt": prompt, "payload": payload}
        st.session_state.pop(result_key, None)
    pending = st.session_state.get(pending_key)
    if pending is not None:
        st.warning(pending["prompt"])
        yes, no, _ = st.columns([1, 1, 6])
        if yes.button("Confirm", key=f"{key}__confirm", type="primary", disabled=not can_write()):
            st.session_state.pop(pending_key, None)
            try:
                st.session_state[result_key] = ("ok", run(pending["payload"]))
            except AdminApiError as exc:
                st.session_state[result_key] = ("error", str(exc))
            st.rerun()
        if no.button("Cancel", key=f"{key}__cancel"):
            st.session_state.pop(pending_key, None)
            st.rerun()
    result = st.session_state.get(result_key)
    if result is not None:
        status, body = result
        if status == "ok" and isinstance(body, dict) and body.get("outcome") == "failed":
            # The call went through but the cluster could not do it (a switch that failed).
            st.error(f"The cluster refused: {body.get('detail') or 'no detail given'}")
            st.json(body, expanded=True)
        elif status == "ok":
            st.success("Done.")
            if body:
                st.json(body, expanded=True)
        else:
            st.error(body)


def fmt_time(value: Any) -> str:
    """Unix seconds or an ISO string → 'YYYY-MM-DD HH:MM:SS' UTC, for tables."""
    ts = to_datetime(value)
    return ts.strftime("%Y-%m-%d %H:%M:%S") if ts else ""


def fmt_age(seconds: float) -> str:
    """How long ago, roughly: '12 s', '4 min', '3 h', '2 d'."""
    s = max(0.0, float(seconds))
    if s < 90:
        return f"{s:.0f} s"
    if s < 90 * 60:
        return f"{s / 60:.0f} min"
    if s < 36 * 3600:
        return f"{s / 3600:.0f} h"
    return f"{s / 86400:.0f} d"


def prediction_status(predictions_t: float | None, last_decision: dict[str, Any] | None, now: float) -> str:
    """The caption of the Planner page's predictions: when they were made and
    whether the planner has decided since without predicting (no data)."""
    if predictions_t is None:
        why = f" Its last decision: {last_decision.get('reason')}." if last_decision else ""
        return "The planner has made no prediction yet: it needs finished requests and iteration records first." + why
    text = f"Made at {fmt_time(predictions_t)} UTC, {fmt_age(now - predictions_t)} ago."
    decided = float(last_decision.get("t") or 0.0) if last_decision else 0.0
    if decided > predictions_t + 1e-6:
        text += f" Since then it decides without predicting: {last_decision.get('reason')}." if last_decision else ""
    return text


def to_datetime(value: Any) -> datetime | None:
    if value is None or value == "":
        return None
    if isinstance(value, (int, float)):
        return datetime.fromtimestamp(float(value), tz=UTC)
    try:
        parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def fmt_bytes(n: float) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"
