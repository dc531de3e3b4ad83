"""kvpool.hashing: exact, stable, salted, chained, full blocks only."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kvpool.hashing import HASH_HEX_CHARS, block_hashes, extend_block_hashes, hash_tag, num_full_blocks

TOKENS = list(range(10))


def test_exact_values_are_stable() -> None:
    # Pinned: changing these breaks every stored block and every peer's directory.
    assert block_hashes(TOKENS, 4, "t") == [
        "f30579ac8904863219f82820b0f5546a",
        "0beca427f1810e69a8f14f7e24816bb2",
    ]


def test_partial_tail_block_gets_no_hash() -> None:
    assert len(block_hashes(TOKENS, 4, "t")) == 2
    assert block_hashes(TOKENS[:3], 4, "t") == []
    assert block_hashes(TOKENS[:8], 4, "t") == block_hashes(TOKENS, 4, "t")
    assert num_full_blocks(10, 4) == 2


def test_salt_isolates_tenants() -> None:
    a, b = block_hashes(TOKENS, 4, "tenant-a"), block_hashes(TOKENS, 4, "tenant-b")
    assert not set(a) & set(b)


def test_chained_hash_depends_on_whole_prefix() -> None:
    base = block_hashes(list(range(12)), 4, "s")
    changed = block_hashes([99] + list(range(1, 12)), 4, "s")
    assert all(x != y for x, y in zip(base, changed, strict=False))
    same_tail = block_hashes(list(range(8)) + [1, 2, 3, 4], 4, "s")
    assert same_tail[:2] == base[:2] and same_tail[2] != base[2]


def test_format_and_tag() -> None:
    for h in block_hashes(list(range(64)), 16, "s"):
        assert len(h) == HASH_HEX_CHARS <= 64 and int(h, 16) >= 0
        assert hash_tag(h).hex() == h
    with pytest.raises(ValueError, match="not a 32-hex-char block hash"):
        hash_tag("abc")


def test_extend_matches_full_hash() -> None:
    full = block_hashes(list(range(40)), 8, "s")
    assert extend_block_hashes(full[:2], list(range(40)), 8, "s") == full
    assert extend_block_hashes([], list(range(40)), 8, "s") == full
    known = full[:5]  # every full block known: nothing hashed, a list of its own
    assert extend_block_hashes(known, list(range(43)), 8, "s") == full
    assert extend_block_hashes(known, list(range(40)), 8, "s") is not known
    assert extend_block_hashes([], list(range(7)), 8, "s") == []
    with pytest.raises(ValueError, match="5 known hashes but only 1 full blocks"):
        extend_block_hashes(full, list(range(8)), 8, "s")


def test_invalid_block_size() -> None:
    with pytest.raises(ValueError, match="block_size must be positive"):
        block_hashes(TOKENS, 0, "s")


def test_deterministic_across_processes() -> None:
    code = "from kvpool.hashing import block_hashes; print(block_hashes(list(range(10)), 4, 't')[1])"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "123", "PATH": ""},
        cwd=".",
    )
    assert out.stdout.strip() == "0beca427f1810e69a8f14f7e24816bb2"
