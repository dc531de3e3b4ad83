"""The credentials a request carries in its headers (checking them is the tenant gate's job)."""

from __future__ import annotations

from collections.abc import Mapping


def bearer(headers: Mapping[str, str]) -> str | None:
    """The key of `Authorization: Bearer <key>`, or None."""
    value = headers.get("authorization")
    if not value:
        return None
    scheme, _, key = value.partition(" ")
    return key.strip() if scheme.lower() == "bearer" and key.strip() else None


def api_key(headers: Mapping[str, str]) -> str | None:
    """Anthropic's `x-api-key`, else the bearer key (what the Anthropic SDK 2.x sends)."""
    key = headers.get("x-api-key")
    return key.strip() if key and key.strip() else bearer(headers)
