"""Identifier syntax shared by the API, the gateway and the workers."""

from __future__ import annotations

import re

# Request, branch and session ids: what may appear in a header, a log line
# and a Redis key without escaping.
ID_RE = re.compile(r"[A-Za-z0-9._:\-]{1,128}\Z")  # use with .match(): \Z, not $, so "id\n" fails
ID_RULE = "1-128 characters of [A-Za-z0-9._:-]"
