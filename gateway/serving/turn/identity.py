"""Which conversation, parent and agent run a request belongs to, from what
agent harnesses send of their own accord (pure; docs/agents.md has the table).

The branch contract's headers (`X-Branch-ID`, `X-Parent-Branch-ID`,
`X-Session-ID`) win; this module only fills what they leave out:

- Codex CLI: conversation = `prompt_cache_key` (its thread id), else the
  `thread-id` / `session-id` headers; parent = `x-codex-parent-thread-id`;
  session = `session_id` in `x-codex-turn-metadata`, else `session-id`.
- Claude Code: conversation and session = `x-claude-code-session-id`, else
  the session in `metadata.user_id` (a JSON string from 2.1 on,
  `..._session_<uuid>` before).
- OpenCode: conversation and session = `x-session-id` (the same header as
  the contract's `X-Session-ID`).
- Agents SDK: the `previous_response_id` chain (the Responses route).
- Anyone else: the conversation's opening (messages up to the first user
  message), the caller's fallback.

Ids that are not valid branch-contract ids (`core.ids.ID_RE`) are hashed
into one by the caller (`conversation_branch_id`), never refused: a harness
cannot be told to change its ids.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

_LEGACY_SESSION = re.compile(r"session_([0-9a-fA-F-]{8,})")


@dataclass(frozen=True)
class HarnessIdentity:
    conversation: str | None = None  # the client's own conversation id: names the branch
    parent: str | None = None  # the parent conversation of a sub-agent
    session: str | None = None  # the agent run that owns the conversation


def _json_object(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def claude_code_session(headers: Mapping[str, str], metadata: Mapping[str, Any] | None) -> str | None:
    """Claude Code's session: its header, else `metadata.user_id` (JSON with
    `session_id` from 2.1 on; `user_<hash>_account_<id>_session_<uuid>` before)."""
    header = headers.get("x-claude-code-session-id")
    if header:
        return header
    user = (metadata or {}).get("user_id")
    if not isinstance(user, str):
        return None
    session = _json_object(user).get("session_id")
    if isinstance(session, str) and session:
        return session
    match = _LEGACY_SESSION.search(user)
    return match.group(1) if match else None


def identity_from(
    headers: Mapping[str, str], *, prompt_cache_key: str | None = None, metadata: Mapping[str, Any] | None = None
) -> HarnessIdentity:
    """The harness identity in `headers` (lower-case lookups) and the body's
    `prompt_cache_key` / Anthropic `metadata` (see the module table)."""
    claude = claude_code_session(headers, metadata)
    if claude:
        return HarnessIdentity(conversation="claude-code:" + claude, session=claude)
    turn = _json_object(headers.get("x-codex-turn-metadata"))
    codex_thread = headers.get("thread-id") or headers.get("session-id")
    if prompt_cache_key or codex_thread or turn:
        session = turn.get("session_id") if isinstance(turn.get("session_id"), str) else headers.get("session-id")
        return HarnessIdentity(
            conversation=prompt_cache_key or codex_thread or turn.get("thread_id") or None,
            parent=headers.get("x-codex-parent-thread-id") or None,
            session=session or None,
        )
    opencode = headers.get("x-session-id") or headers.get("x-session-affinity")
    if opencode:
        return HarnessIdentity(conversation="session:" + opencode, session=opencode)
    return HarnessIdentity()


# What `json.dumps(..., separators=(",", ":"), ensure_ascii=False, sort_keys=True)` writes; orjson
# writes the same bytes (tested) 8x faster, this encoder the rest (an int beyond 64 bits, a lone surrogate).
_OPENING = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, sort_keys=True)


def opening_key(messages: list[dict[str, Any]]) -> str:
    """The conversation's opening (messages up to the first user message) as
    a key: a harness resending its growing history stays on one branch."""
    end = next((i for i, m in enumerate(messages) if m.get("role") == "user"), len(messages) - 1)
    opening = messages[: end + 1]
    try:
        raw = orjson.dumps(opening, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        raw = _OPENING.encode(opening).encode("utf-8", "surrogatepass")
    return "opening:" + hashlib.sha256(raw).hexdigest()
