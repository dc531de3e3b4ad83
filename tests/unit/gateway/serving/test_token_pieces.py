"""Chat prompts tokenized piece by piece (gateway.serving.token_pieces): the
same ids as the tokenizer on the whole text, pieces cached per scope."""

from __future__ import annotations

import pathlib
import random
from typing import Any

import pytest

from gateway.serving.token_pieces import PieceEncoder
from gateway.serving.tokenize import PromptTokenizer

DEMO_MODEL = pathlib.Path(__file__).resolve().parents[4] / "data" / "demo-model"
WORDS = ["a", " b", "  ", "\n", "\n\n", "é", "日本", "12", "ab3", "Hello,", " world!", "\t", "<|", "|>", "im_end", "🎉"]


def whole(tok: PromptTokenizer, text: str) -> list[int]:
    return tok.hf.backend_tokenizer.encode_batch_fast([text], add_special_tokens=False)[0].ids


def random_texts(tok: PromptTokenizer, n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    specials = sorted(t.content for t in tok.hf.backend_tokenizer.get_added_tokens_decoder().values())
    return ["".join(rng.choice(WORDS + specials) for _ in range(rng.randint(0, 30))) for _ in range(n)]


def tokenizers(tiny: PromptTokenizer) -> list[PromptTokenizer]:
    out = [tiny]
    if (DEMO_MODEL / "tokenizer.json").exists():  # made by `make setup`
        out.append(PromptTokenizer.from_dir(str(DEMO_MODEL)))
    return out


def test_pieces_give_the_ids_of_the_whole_text(tokenizer: PromptTokenizer) -> None:
    for tok in tokenizers(tokenizer):
        assert tok.pieces is not None
        for text in random_texts(tok, 300):
            assert tok.pieces.encode(text, scope="t") == whole(tok, text), text  # cold, then from the cache
            assert tok.pieces.encode(text, scope="t") == whole(tok, text), text


def test_a_chat_prompt_resent_with_one_more_message_tokenizes_only_the_new_pieces(tokenizer: PromptTokenizer) -> None:
    pieces = PieceEncoder.for_tokenizer(tokenizer.hf.backend_tokenizer)
    assert pieces is not None
    chat = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "List files."}]
    first = tokenizer.render_chat(chat)
    assert pieces.encode(first, scope="t") == whole(tokenizer, first)
    seen = pieces.misses
    longer = tokenizer.render_chat([*chat, {"role": "assistant", "content": "ls"}, {"role": "user", "content": "Go."}])
    assert pieces.encode(longer, scope="t") == whole(tokenizer, longer)
    # the two new messages (the closing assistant header was a piece before too)
    assert pieces.misses - seen == 2
    pieces.encode(longer, scope="other tenant")  # another scope shares nothing: its 6 distinct pieces
    assert pieces.misses - seen == 2 + 6


def test_the_cache_keeps_at_most_its_characters(tokenizer: PromptTokenizer) -> None:
    fast = tokenizer.hf.backend_tokenizer
    pieces = PieceEncoder.for_tokenizer(fast, max_chars=10, max_piece_chars=6)
    assert pieces is not None
    assert pieces.encode("abcdef<|im_end|>ghij", scope="t") == whole(tokenizer, "abcdef<|im_end|>ghij")
    assert pieces.encode("abcdefg", scope="t") == whole(tokenizer, "abcdefg")  # too long to keep
    pieces.encode("klmnop", scope="t")  # 6 + 4 + 6 > 10: "abcdef" goes
    before = pieces.misses
    pieces.encode("ghij", scope="t")
    pieces.encode("abcdef", scope="t")
    assert pieces.misses - before == 1


class _Token:
    def __init__(self, content: str, **flags: bool) -> None:
        self.content = content
        self.normalized = self.lstrip = self.rstrip = self.single_word = False
        self.__dict__.update(flags)


class _Fast:
    """A stand-in for a Rust tokenizer whose added tokens or normalizer make the cut inexact."""

    def __init__(self, normalizer: Any = None, **flags: bool) -> None:
        self.normalizer = normalizer
        self._tokens = {1: _Token("<s>", **flags)}

    def get_added_tokens_decoder(self) -> dict[int, _Token]:
        return self._tokens


@pytest.mark.parametrize(
    "fast",
    [
        _Fast(normalizer=object()),
        _Fast(lstrip=True),
        _Fast(rstrip=True),
        _Fast(normalized=True),
        _Fast(single_word=True),
    ],
)
def test_no_piece_encoder_where_the_cut_is_not_the_tokenizers(fast: _Fast) -> None:
    assert PieceEncoder.for_tokenizer(fast) is None
