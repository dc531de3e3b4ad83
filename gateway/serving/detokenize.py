"""Token ids -> text, token by token, for streamed answers.

Two detokenizers with one interface (`push(ids) -> str`, `flush() -> str`):

- `ByteDetokenizer`, for byte-level BPE tokenizers (GPT-2's decoder: the
  demo model, Llama 3, Qwen): every token stands for a fixed byte string,
  so a stream's text is its tokens' bytes read as UTF-8 with errors
  replaced. A token whose bytes are whole characters (most) is one
  lookup in a table of texts; the others go through `utf_8_decode` with
  what is held back. Far less than a `DecodeStream` step (~1.2 µs on an
  11.4 µs machine), which every relayed token of every stream took.
  `ByteTable.for_tokenizer` builds
  the table only for a tokenizer whose decoder is that and nothing more,
  and only when the table reproduces the tokenizer's own decode of every
  id in its vocabulary and of probe sequences that split characters
  across tokens; for any other tokenizer it returns None.
- `IncrementalDetokenizer`, for every other tokenizer: the tokenizers
  library's `DecodeStream`, one Rust call a token over a short window.

Both hold back an incomplete UTF-8 character until the token that ends
it; `flush` gives what is still held back (a truncated character as
U+FFFD). The text of all deltas and the flush is the tokenizer's decode of
all the ids (tested for both); only where a character is cut in two may
the deltas split differently.
"""

from __future__ import annotations

import random
from codecs import utf_8_decode
from collections.abc import Sequence
from typing import Any

from tokenizers.decoders import DecodeStream

# Text whose tokens split multi-byte characters (accents, CJK, an emoji) for the probe sequences.
_PROBE = "naïve café — 日本語のテキスト 🙂 ünïcödé\n\t x"
_PROBE_SEQUENCES = 64  # random id sequences checked against the tokenizer's decode, besides the probe text


class _Pieces:
    """Each id's bytes, and its text where they are whole UTF-8 characters (else None)."""

    __slots__ = ("data", "texts")

    def __init__(self, data: list[bytes], texts: list[str | None] | None = None) -> None:
        self.data = data
        self.texts = texts if texts is not None else [_whole_text(b) for b in data]

    def without(self, ids: frozenset[int]) -> _Pieces:
        """The same with `ids` standing for nothing."""
        return _Pieces(
            [b"" if i in ids else b for i, b in enumerate(self.data)],
            ["" if i in ids else t for i, t in enumerate(self.texts)],
        )


class ByteTable:
    """The bytes each token id stands for, skipping special tokens or keeping
    them (all but `skip`), for a byte-level BPE tokenizer."""

    __slots__ = ("_fast", "_pieces")

    def __init__(self, fast: Any, skipping: list[bytes], keeping: list[bytes]) -> None:
        self._fast = fast
        # By (skip_special_tokens, skip): the two tables, and those with `skip` ids emptied as asked.
        self._pieces = {(True, frozenset[int]()): _Pieces(skipping), (False, frozenset[int]()): _Pieces(keeping)}

    @classmethod
    def for_tokenizer(cls, fast: Any, byte_decoder: dict[str, int] | None) -> ByteTable | None:
        """The table of `fast` (a `tokenizers.Tokenizer`), or None where it
        would not be exact: a decoder other than a lone ByteLevel, or any id
        or probe whose bytes read otherwise than the tokenizer decodes them."""
        if byte_decoder is None or type(fast.decoder).__name__ != "ByteLevel":
            return None
        size = fast.get_vocab_size(with_added_tokens=True)
        pieces = [fast.id_to_token(i) for i in range(size)]
        if any(p is None for p in pieces):
            return None  # a gap in the ids: not a table
        to_latin1 = _latin1_table(byte_decoder)
        keeping = [_piece_bytes(p, to_latin1) for p in pieces]
        special = {i for i, tok in fast.get_added_tokens_decoder().items() if tok.special}
        skipping = [b"" if i in special else b for i, b in enumerate(keeping)]
        table = cls(fast, skipping, keeping)
        return table if table._reproduces(size) else None

    def _reproduces(self, size: int) -> bool:
        fast = self._fast
        ids = [[i] for i in range(size)]
        rnd = random.Random(0)
        probes = [fast.encode(_PROBE, add_special_tokens=False).ids]
        probes += [[rnd.randrange(size) for _ in range(rnd.randrange(2, 24))] for _ in range(_PROBE_SEQUENCES)]
        for skip in (True, False):
            table = self._pieces[skip, frozenset()].data
            if fast.decode_batch(ids, skip_special_tokens=skip) != [b.decode("utf-8", "replace") for b in table]:
                return False
            texts = fast.decode_batch(probes, skip_special_tokens=skip)
            if texts != [b"".join(table[i] for i in seq).decode("utf-8", "replace") for seq in probes]:
                return False
        return True

    def token_bytes(self, token_id: int) -> bytes | None:
        """The bytes `token_id` stands for, special tokens kept (None outside the vocabulary)."""
        data = self._pieces[False, frozenset()].data
        return data[token_id] if 0 <= token_id < len(data) else None

    def detokenizer(self, *, skip_special_tokens: bool, skip: frozenset[int] = frozenset()) -> ByteDetokenizer:
        pieces = self._pieces.get((skip_special_tokens, skip))
        if pieces is None:  # once per set of ids (EOS): not a copy of the table per request
            pieces = self._pieces[skip_special_tokens, skip] = self._pieces[skip_special_tokens, frozenset()].without(
                skip
            )
        return ByteDetokenizer(pieces.data, pieces.texts)


def _whole_text(piece: bytes) -> str | None:
    """`piece` as text when it is whole UTF-8 characters, else None."""
    try:
        return piece.decode()
    except UnicodeDecodeError:
        return None


def _latin1_table(byte_decoder: dict[str, int]) -> dict[int, int]:
    """A `str.translate` table: each character of the byte map -> the
    character of its byte's value; every other character below 256 -> one
    that Latin-1 cannot encode (so that a piece holding one fails as a whole)."""
    table = {ord(c): b for c, b in byte_decoder.items()}
    for code in range(256):
        table.setdefault(code, 0x10FFFF)
    return table


def _piece_bytes(piece: str, to_latin1: dict[int, int]) -> bytes:
    """A vocabulary string's bytes as the ByteLevel decoder reads it: each
    character mapped back to its byte; a string with a character outside
    the map (an added token written as plain text) as its own UTF-8."""
    try:
        return piece.translate(to_latin1).encode("latin-1")
    except UnicodeEncodeError:
        return piece.encode()


class ByteDetokenizer:
    """A stream's text from a `ByteTable` (see the module doc); ids outside the table add nothing.

    A token whose bytes are whole characters (most) is read from a table of
    its text when nothing is held back: a lookup a token, no decode."""

    __slots__ = ("_table", "_texts", "_size", "_held")

    def __init__(self, table: list[bytes], texts: list[str | None]) -> None:
        self._table = table
        self._texts = texts  # each id's text when its bytes are whole UTF-8 characters, else None
        self._size = len(table)
        self._held = b""  # the start of a character whose last bytes have not come yet

    def push(self, token_ids: Sequence[int]) -> str:
        size = self._size
        if len(token_ids) == 1:  # a read's one token (the usual case)
            token_id = token_ids[0]
            if not 0 <= token_id < size:
                return ""
            if not self._held:
                text = self._texts[token_id]
                if text is not None:
                    return text
            data = self._held + self._table[token_id]
        else:
            table = self._table
            data = self._held + b"".join(table[t] for t in token_ids if 0 <= t < size)
        text, used = utf_8_decode(data, "replace", False)  # stops before an incomplete last character
        self._held = data[used:]
        return text

    def flush(self) -> str:
        """What is still held back (U+FFFD for a truncated character)."""
        held, self._held = self._held, b""
        return utf_8_decode(held, "replace", True)[0] if held else ""


class IncrementalDetokenizer:
    """A stream's text through the tokenizers library's `DecodeStream`: it
    decodes a short window and emits what the newest token adds, so
    per-token cost stays O(window), not O(sequence), and byte-level tokens
    that split a character wait for the rest of it. `skip` ids (EOS when
    special tokens are kept) never reach it. `flush` reads what is held
    back from the window of the last text emitted."""

    def __init__(self, tokenizer: Any, *, skip_special_tokens: bool, skip: frozenset[int] = frozenset()) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._stream = DecodeStream(skip_special_tokens=skip_special_tokens)
        self._skip = skip
        self._held: list[int] = []  # ids since the last text emitted
        self._window: list[int] = []  # the ids of the last text emitted

    def push(self, token_ids: Sequence[int]) -> str:
        step, tokenizer, out = self._stream.step, self._tokenizer, ""
        for token_id in token_ids:
            if token_id in self._skip:
                continue
            self._held.append(token_id)
            text = step(tokenizer, token_id)
            if text is not None:
                out += text  # a read's one token (the usual case): its text as is, no list or join
                self._window, self._held = self._held, []
        return out

    def flush(self) -> str:
        """What is still held back (may contain U+FFFD for a truncated character)."""
        if not self._held:
            return ""
        decode, skip = self._tokenizer.decode, self._skip_special
        window, self._held = self._window + self._held, []
        before = decode(self._window, skip_special_tokens=skip)
        after = decode(window, skip_special_tokens=skip)
        self._window = window
        return after[len(before) :] if len(after) > len(before) else ""


Detokenizer = ByteDetokenizer | IncrementalDetokenizer
