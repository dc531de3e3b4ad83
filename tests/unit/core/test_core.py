"""core: Phase and Role, finish reasons, the id syntax."""

from __future__ import annotations

import pytest

from core import ID_RE, FinishReason, Phase, Role


def test_phase_other() -> None:
    assert Phase.PREFILL.other is Phase.DECODE
    assert Phase.DECODE.other is Phase.PREFILL


def test_role_phase() -> None:
    assert Role.PREFILL.phase is Phase.PREFILL
    assert Role.DECODE.phase is Phase.DECODE


@pytest.mark.parametrize(
    ("reason", "ends_request", "resumable"),
    [
        (FinishReason.STOP, True, False),
        (FinishReason.LENGTH, True, False),
        (FinishReason.ABORT, False, True),
        (FinishReason.MIGRATED, False, True),
        (FinishReason.ERROR, False, False),
    ],
)
def test_finish_reason(reason: FinishReason, ends_request: bool, resumable: bool) -> None:
    assert (reason.ends_request, reason.resumable) == (ends_request, resumable)


def test_the_finish_table_covers_every_reason() -> None:
    assert [r.value for r in FinishReason] == ["stop", "length", "abort", "migrated", "error"]


@pytest.mark.parametrize(
    "text",
    ["r", "req-1", "chatcmpl_ABC.42", "tenant:branch:7", "A-Z_a.z:0-9", "x" * 128],
)
def test_id_re_accepts(text: str) -> None:
    assert ID_RE.match(text)


@pytest.mark.parametrize(
    "text",
    ["", "x" * 129, "a b", "a/b", "a\nb", "\nid", "a\tb", "ünï", "a,b", "a*", "a{b}", "a%20b", "a+b", "a@b"],
)
def test_id_re_rejects(text: str) -> None:
    assert ID_RE.match(text) is None


# `$` would also match before a final newline: "id\n" must not pass.
@pytest.mark.parametrize(
    "text",
    [
        "id\n",
        "x" * 128 + "\n",
    ],
)
def test_id_re_rejects_a_trailing_newline(text: str) -> None:
    assert ID_RE.match(text) is None
