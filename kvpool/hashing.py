"""Chained, salted KV block hashes (pure; the gateway and every worker use this).

Contract:
- One hash per *full* block of `block_size` tokens; a partial tail block gets
  none (it is never saved, so it can never be shared).
- Hash i depends on the salt and on every token in blocks 0..i (chained), so
  equal hash i means equal prefix up to the end of block i.
- Different salts never produce equal hashes for the same tokens in practice
  (the salt seeds the chain). The gateway salts per tenant *and* model, so
  tenants never share blocks and models never mix KV layouts.
- Hex strings of `HASH_HEX_CHARS` (32) characters: BLAKE2b with a 16-byte
  digest. Deterministic across processes, machines and Python versions (no
  `hash()`, tokens encoded as little-endian int64).
- `HASH_BYTES` (16) is also the size of the per-slot tag in the host store:
  `hash_tag(h)` is the raw digest of a hex hash.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

HASH_BYTES = 16
HASH_HEX_CHARS = 2 * HASH_BYTES
# Bump when the encoding changes: old and new hashes must never collide.
_DOMAIN = b"evolving-infra/kvpool/block-hash/v1"


def _root(salt: str) -> bytes:
    return hashlib.blake2b(_DOMAIN + b"\x00" + salt.encode("utf-8"), digest_size=HASH_BYTES).digest()


def _encode(token_ids: Sequence[int]) -> bytes:
    return np.asarray(token_ids, dtype="<i8").tobytes()


def num_full_blocks(num_tokens: int, block_size: int) -> int:
    """How many hashes `block_hashes` returns for `num_tokens` tokens."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    return max(num_tokens, 0) // block_size


def block_hashes(token_ids: Sequence[int], block_size: int, salt: str) -> list[str]:
    """Chained hashes of every full block of `token_ids`.

    h_i = blake2b16(h_{i-1} || int64le(tokens of block i)), h_{-1} = root(salt).
    """
    return extend_block_hashes([], token_ids, block_size, salt)


def extend_block_hashes(known: Sequence[str], token_ids: Sequence[int], block_size: int, salt: str) -> list[str]:
    """`block_hashes(token_ids, ...)`, reusing `known` (a prefix of the answer).

    For decode: hash only the blocks completed since the last call. `known`
    must be the hashes of the first len(known) blocks of the same tokens and
    salt (not re-checked; that is the caller's invariant).
    """
    n = num_full_blocks(len(token_ids), block_size)
    if len(known) > n:
        raise ValueError(f"{len(known)} known hashes but only {n} full blocks")
    out = list(known)
    if n == len(out):  # no full block beyond `known` (a prompt under one block): nothing to hash
        return out
    prev = bytes.fromhex(out[-1]) if out else _root(salt)
    encoded = _encode(token_ids[len(out) * block_size : n * block_size])
    step = 8 * block_size
    for off in range(0, len(encoded), step):
        prev = hashlib.blake2b(prev + encoded[off : off + step], digest_size=HASH_BYTES).digest()
        out.append(prev.hex())
    return out


def hash_tag(block_hash: str) -> bytes:
    """The 16 raw bytes of a hex block hash (the host store's slot tag)."""
    try:
        raw = bytes.fromhex(block_hash)
    except ValueError:  # odd length or a non-hex character: the same error as a wrong length
        raw = b""
    if len(raw) != HASH_BYTES:
        raise ValueError(f"not a {HASH_HEX_CHARS}-hex-char block hash: {block_hash!r}")
    return raw
