"""A rendered prompt's token ids, piece by piece, with the pieces remembered.

A Hugging Face tokenizer cuts its input at its added tokens (a chat
template's `<|im_start|>`, `<|im_end|>`, ...) before anything else and
tokenizes the text between them one piece at a time, each on its own. An
agent resends its whole conversation every turn, so all but its newest
messages are pieces this gateway tokenized before. `PieceEncoder` cuts the
same way and runs the Rust tokenizer only on the pieces it has not seen (in
one batch call); the others come from a bounded cache.

Exactness: the cut is the tokenizer's own only where it is plain: no
normalizer, every added token matched as written (`normalized`, `lstrip`,
`rstrip` and `single_word` all off). `PieceEncoder.for_tokenizer` returns
None for any other tokenizer (the caller encodes whole texts), and checks a
probe text against the tokenizer itself before it is used. Where two added
tokens overlap, the longest one at the leftmost position wins, as in the
tokenizer's matcher.

Isolation: pieces are remembered per `scope` (the caller passes the
tenant's cache salt), so one tenant's cache hit never tells it what
another tenant sent, as with the KV pool's salted block hashes.

Thread safety: `encode` may run in the gateway's tokenizing threads; the
cache is read and written under a lock, the tokenizer runs outside it.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from typing import Any

# Added tokens between text that tokenizes differently alone and in context if the cut were wrong:
# leading and trailing spaces, newlines, an accent, digits against letters.
_PROBE_TEXTS = (" a  b\n\n", "x", "é 12ab ", "\n", "  ", "Hello, world!")


class PieceEncoder:
    """Token ids of texts cut at `added` (content -> id), pieces cached per scope.

    `max_chars`: characters the cache holds at most, least recently used
    pieces going first (4M characters: ~1M token ids, some 40 MB with the
    strings); a piece longer than `max_piece_chars` is encoded but not kept."""

    def __init__(
        self, fast: Any, added: dict[str, int], *, max_chars: int = 4_000_000, max_piece_chars: int = 256 * 1024
    ) -> None:
        if not added:
            raise ValueError("no added tokens to cut at")
        self._fast = fast
        self._added = dict(added)
        # Longest first: at one position the longest token matches (leftmost-longest).
        alternatives = "|".join(re.escape(t) for t in sorted(added, key=len, reverse=True))
        self._cut = re.compile(f"({alternatives})")
        self._max_chars = max_chars
        self._max_piece_chars = max_piece_chars
        self._cache: OrderedDict[tuple[str, str], list[int]] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @classmethod
    def for_tokenizer(cls, fast: Any, **limits: int) -> PieceEncoder | None:
        """A `PieceEncoder` for the Rust tokenizer `fast`, or None where its cut is not plain."""
        if fast.normalizer is not None:
            return None
        tokens = fast.get_added_tokens_decoder()
        if not tokens or any(t.normalized or t.lstrip or t.rstrip or t.single_word for t in tokens.values()):
            return None
        encoder = cls(fast, {t.content: token_id for token_id, t in tokens.items()}, **limits)
        contents = sorted(encoder._added)
        probe = "".join(text + contents[i % len(contents)] for i, text in enumerate(_PROBE_TEXTS * 2)) + "end "
        whole = fast.encode_batch_fast([probe], add_special_tokens=False)[0].ids
        if encoder.encode(probe, scope="") != whole:
            return None
        encoder.clear()
        return encoder

    def encode(self, text: str, *, scope: str) -> list[int]:
        """The ids `text` tokenizes to (no special tokens added around it)."""
        parts = self._cut.split(text)  # text, token, text, token, ..., text
        pieces = parts[0::2]
        found: dict[int, list[int]] = {}
        with self._lock:
            for i, piece in enumerate(pieces):
                if piece:
                    ids = self._cache.get((scope, piece))
                    if ids is not None:
                        self._cache.move_to_end((scope, piece))
                        found[i] = ids
            self.hits += len(found)
        missing = [i for i, piece in enumerate(pieces) if piece and i not in found]
        if missing:
            encoded = self._fast.encode_batch_fast([pieces[i] for i in missing], add_special_tokens=False)
            new = {i: e.ids for i, e in zip(missing, encoded, strict=True)}
            found.update(new)
            self._remember(scope, {pieces[i]: ids for i, ids in new.items()})
        out: list[int] = []
        for i, piece in enumerate(pieces):
            if piece:
                out.extend(found[i])
            if 2 * i + 1 < len(parts):
                out.append(self._added[parts[2 * i + 1]])
        return out

    def _remember(self, scope: str, pieces: dict[str, list[int]]) -> None:
        with self._lock:
            self.misses += len(pieces)
            for piece, ids in pieces.items():
                if len(piece) > self._max_piece_chars or (scope, piece) in self._cache:
                    continue
                self._cache[(scope, piece)] = ids
                self._chars += len(piece)
            while self._chars > self._max_chars:
                (_, old), _ids = self._cache.popitem(last=False)
                self._chars -= len(old)

    def clear(self) -> None:
        with self._lock:
            self._cache.clear()
            self._chars = 0
            self.hits = self.misses = 0
