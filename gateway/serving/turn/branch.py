"""The branch contract of one request (docs/agents.md), from its headers and,
without `X-Branch-ID`, from the client's own conversation id
(gateway.serving.turn.identity) or the conversation's opening."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from core.ids import ID_RE
from gateway.http.errors import InvalidRequest
from gateway.serving.turn.identity import identity_from, opening_key


@dataclass(frozen=True)
class BranchContext:
    """The branch contract of one request, already validated and tenant-scoped."""

    key: str  # "<tenant>/<branch id>": branches of different tenants never collide
    branch_id: str
    parent_key: str | None
    session_id: str | None
    finish_at_end: bool  # X-Branch-Finished: true, or a one-request branch
    one_shot: bool = False  # no X-Branch-ID: a branch that lives for this request only


def _checked_id(value: str | None, header: str) -> str | None:
    if value is None or value == "":
        return None
    if not ID_RE.match(value):
        raise InvalidRequest(f"{header} must be 1-128 characters of [A-Za-z0-9._:-]", param=header)
    return value


def conversation_branch_id(conversation: str) -> str:
    """A branch id for a client's own conversation or session id (any text)."""
    return "conv-" + hashlib.sha256(conversation.encode()).hexdigest()[:40]


def parse_branch_headers(
    tenant_id: str,
    *,
    branch_id: str | None,
    parent_id: str | None,
    session_id: str | None,
    finished: str | None,
    conversation: str | None = None,
    parent_conversation: str | None = None,
) -> BranchContext:
    """The branch contract. Without `X-Branch-ID`, a `conversation` id the
    client sent its own way (`prompt_cache_key`, a Responses chain, a
    harness's session header, the conversation's opening) names the branch;
    with neither, the branch lives for this request only. Without
    `X-Parent-Branch-ID`, a sub-agent's `parent_conversation` names its parent."""
    bid = _checked_id(branch_id, "X-Branch-ID")
    parent = _checked_id(parent_id, "X-Parent-Branch-ID")
    if parent is None and parent_conversation:
        parent = conversation_branch_id(parent_conversation)
    session = _checked_id(session_id, "X-Session-ID")
    flag = (finished or "").strip().lower()
    if flag not in ("", "true", "false", "1", "0"):
        raise InvalidRequest("X-Branch-Finished must be 'true' or 'false'", param="X-Branch-Finished")
    if bid is None and conversation:
        bid = conversation_branch_id(conversation)
    one_shot = bid is None
    bid = bid or f"req-{secrets.token_hex(16)}"
    return BranchContext(
        key=f"{tenant_id}/{bid}",
        branch_id=bid,
        parent_key=f"{tenant_id}/{parent}" if parent else None,
        session_id=session,
        finish_at_end=one_shot or flag in ("true", "1"),
        one_shot=one_shot,
    )


def branch_from_headers(
    headers: Mapping[str, str],
    tenant_id: str,
    *,
    conversation: str | None = None,
    metadata: dict[str, Any] | None = None,
    messages: list[dict[str, Any]] | None = None,
) -> BranchContext:
    """The branch contract from the headers. Without X-Branch-ID, the
    client's own conversation id names the branch, which then lives until its
    idle TTL: the API's (`conversation`: `prompt_cache_key`, a Responses
    chain), else the harness's (gateway.serving.turn.identity), else the
    opening of `messages`."""
    ident = identity_from(headers, prompt_cache_key=conversation, metadata=metadata)
    session = headers.get("x-session-id") or ident.session
    return parse_branch_headers(
        tenant_id,
        branch_id=headers.get("x-branch-id"),
        parent_id=headers.get("x-parent-branch-id"),
        session_id=session if session and ID_RE.match(session) else None,
        finished=headers.get("x-branch-finished"),
        conversation=ident.conversation or (opening_key(messages) if messages else None),
        parent_conversation=ident.parent,
    )
