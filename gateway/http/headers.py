"""A request's headers as one plain dict, built once per request.

Starlette's `Headers.get` lower-cases and encodes the name and scans every
header on each call; the branch contract and the harness identities look up
about ten names per request. ASGI servers give header names in lower case.
"""

from __future__ import annotations

from collections.abc import Iterable


def header_dict(raw: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """name -> value (latin-1, as Starlette decodes them); a repeated name keeps its first value, as `Headers.get`."""
    out: dict[str, str] = {}
    for name, value in raw:
        key = name.decode("latin-1").lower()
        if key not in out:
            out[key] = value.decode("latin-1")
    return out
