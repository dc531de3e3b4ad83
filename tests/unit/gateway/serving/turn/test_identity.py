"""Harness identities -> conversation, parent and session (literal headers as the harnesses send them)."""

from __future__ import annotations

import hashlib
import json

import pytest

from gateway.serving.turn.identity import HarnessIdentity, claude_code_session, identity_from, opening_key

THREAD = "01a23c7a-7dc3-7731-89c0-08bdc2fa506c"


def test_codex_thread_names_the_conversation_and_its_metadata_the_session() -> None:
    headers = {
        "session-id": THREAD,
        "thread-id": THREAD,
        "x-codex-turn-metadata": json.dumps({"session_id": "root-run", "thread_id": THREAD}),
    }
    assert identity_from(headers, prompt_cache_key=THREAD) == HarnessIdentity(THREAD, None, "root-run")
    # without prompt_cache_key the thread header still names it
    assert identity_from(headers).conversation == THREAD


def test_codex_sub_agent_names_its_parent_thread() -> None:
    headers = {"session-id": "child", "x-codex-parent-thread-id": THREAD}
    ident = identity_from(headers, prompt_cache_key="child")
    assert ident.conversation == "child" and ident.parent == THREAD


def test_claude_code_header_then_metadata_json_then_legacy_form() -> None:
    assert identity_from({"x-claude-code-session-id": "abc-123"}).conversation == "claude-code:abc-123"
    meta = {"user_id": json.dumps({"device_id": "d", "account_uuid": "", "session_id": "5e55-10"})}
    assert claude_code_session({}, meta) == "5e55-10"
    legacy = {"user_id": "user_ab12_account__session_0f1e2d3c-aaaa"}
    assert claude_code_session({}, legacy) == "0f1e2d3c-aaaa"
    assert claude_code_session({}, {"user_id": "not json, no session"}) is None


def test_opencode_session_header_names_the_conversation() -> None:
    ident = identity_from({"x-session-id": "ses_42", "x-session-affinity": "ses_42"})
    assert ident == HarnessIdentity("session:ses_42", None, "ses_42")


def test_no_identity_and_the_opening_fallback() -> None:
    assert identity_from({}) == HarnessIdentity()
    first = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    later = [*first, {"role": "assistant", "content": "a"}, {"role": "user", "content": "v"}]
    assert opening_key(first) == opening_key(later)  # a growing history stays on one branch
    assert opening_key(first) != opening_key([{"role": "user", "content": "other"}])


@pytest.mark.parametrize(
    "content",
    [
        'quotes " and \\ backslash, \n\t\x00\x1f controls, é 日本 🙂 \u2028 </script>',
        [{"type": "text", "text": "part", "cache_control": {"type": "ephemeral"}}],
    ],
)
def test_opening_key_hashes_the_sorted_compact_json_of_the_opening(content) -> None:
    messages = [{"role": "system", "content": content, "z": 1.5, "a": 2**64 - 1}, {"role": "user", "content": "go"}]
    messages.append({"role": "assistant", "content": "not part of the opening"})
    text = json.dumps(messages[:2], separators=(",", ":"), ensure_ascii=False, sort_keys=True)
    assert opening_key(messages) == "opening:" + hashlib.sha256(text.encode()).hexdigest()


def test_opening_key_takes_what_orjson_cannot_write() -> None:
    huge = [{"role": "user", "content": "x", "n": 2**70}]
    text = json.dumps(huge, separators=(",", ":"), ensure_ascii=False, sort_keys=True)
    assert opening_key(huge) == "opening:" + hashlib.sha256(text.encode()).hexdigest()
    assert opening_key([{"role": "user", "content": "lone \ud800"}]).startswith("opening:")
