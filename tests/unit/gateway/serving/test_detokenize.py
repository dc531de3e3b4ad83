"""Streamed text from token ids: the byte table where it is exact (byte-level
BPE), `DecodeStream` elsewhere; either way the deltas and the flush add up
to the tokenizer's decode of all the ids."""

from __future__ import annotations

import pathlib
import random

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from gateway.serving.detokenize import ByteDetokenizer, ByteTable, IncrementalDetokenizer
from gateway.serving.tokenize import PromptTokenizer

DEMO_MODEL = pathlib.Path(__file__).resolve().parents[4] / "data" / "demo-model"


def _tokenizers(tiny: PromptTokenizer) -> list[PromptTokenizer]:
    out = [tiny]
    if (DEMO_MODEL / "tokenizer.json").exists():  # made by `make setup`
        out.append(PromptTokenizer.from_dir(str(DEMO_MODEL)))
    return out


def _streamed(detok: ByteDetokenizer | IncrementalDetokenizer, ids: list[int], rnd: random.Random) -> str:
    out, i = [], 0
    while i < len(ids):
        k = rnd.randrange(1, 4)
        out.append(detok.push(ids[i : i + k]))
        i += k
    return "".join(out) + detok.flush()


def test_byte_level_tokenizers_get_the_byte_table(tokenizer: PromptTokenizer) -> None:
    for tok in _tokenizers(tokenizer):
        assert isinstance(tok.detokenizer(), ByteDetokenizer)
        assert isinstance(tok.detokenizer(skip_special_tokens=False), ByteDetokenizer)


@pytest.mark.parametrize("skip_special", [True, False])
def test_both_ways_stream_the_full_decode_of_random_ids(tokenizer: PromptTokenizer, skip_special: bool) -> None:
    """Random ids (characters split across tokens, special tokens, EOS) in
    random groups, through the table and through `DecodeStream`."""
    rnd = random.Random(11)
    for tok in _tokenizers(tokenizer):
        full = tok.decode if skip_special else tok.decode_keeping_special
        eos = frozenset(() if skip_special or tok.eos_token_id is None else (tok.eos_token_id,))
        fast = tok.hf.backend_tokenizer
        for _ in range(150):
            ids = [rnd.randrange(tok.vocab_size) for _ in range(rnd.randrange(1, 40))]
            if tok.eos_token_id is not None and rnd.random() < 0.3:
                ids.insert(rnd.randrange(len(ids) + 1), tok.eos_token_id)
            table = tok.detokenizer(skip_special_tokens=skip_special)
            stream = IncrementalDetokenizer(fast, skip_special_tokens=skip_special, skip=eos)
            assert _streamed(table, ids, rnd) == full(ids)
            assert _streamed(stream, ids, rnd) == full(ids)


def test_a_split_character_waits_for_its_last_byte(tokenizer: PromptTokenizer) -> None:
    detok = tokenizer.detokenizer()
    ids = tokenizer.encode_text("日", add_special_tokens=False)
    assert len(ids) > 1  # the tiny vocabulary spells it in bytes
    assert [detok.push([i]) for i in ids] == [""] * (len(ids) - 1) + ["日"]
    cut = tokenizer.detokenizer()
    assert cut.push(ids[:-1]) == ""
    assert cut.flush() == "\ufffd"  # a truncated character, as the tokenizer's own decode gives it
    assert tokenizer.decode(ids[:-1]) == "\ufffd"


def test_ids_outside_the_vocabulary_add_nothing(tokenizer: PromptTokenizer) -> None:
    detok = tokenizer.detokenizer()
    ok = tokenizer.encode_text("ok", add_special_tokens=False)
    assert detok.push([-1, tokenizer.vocab_size + 5, *ok]) == "ok"
    assert detok.push([tokenizer.vocab_size + 5]) == ""
    assert detok.push([-3]) == ""


def _word_level() -> Tokenizer:
    raw = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1, "b": 2}, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    return raw


def test_other_decoders_stream_through_decode_stream(tokenizer: PromptTokenizer) -> None:
    """No table for a tokenizer whose decoder is not a lone ByteLevel: a
    word-level one, or ByteLevel inside a sequence that strips text."""
    plain = _word_level()
    hf = PreTrainedTokenizerFast(tokenizer_object=plain, unk_token="[UNK]", chat_template="{{ messages[0].content }}")
    assert isinstance(PromptTokenizer(hf).detokenizer(), IncrementalDetokenizer)
    byte_decoder = tokenizer._byte_decoder
    assert byte_decoder is not None
    fast = Tokenizer.from_str(tokenizer.hf.backend_tokenizer.to_str())
    assert ByteTable.for_tokenizer(fast, byte_decoder) is not None
    fast.decoder = decoders.Sequence([decoders.ByteLevel(), decoders.Strip(content=" ", left=1)])
    assert ByteTable.for_tokenizer(fast, byte_decoder) is None
    assert ByteTable.for_tokenizer(fast, None) is None


def test_a_table_that_does_not_reproduce_the_decode_is_refused(tokenizer: PromptTokenizer) -> None:
    """The byte map is checked, not trusted: a map with two bytes swapped
    reads the vocabulary otherwise than the tokenizer decodes it."""
    byte_decoder = dict(tokenizer._byte_decoder or {})
    a, b = (c for c, v in byte_decoder.items() if v in (ord("a"), ord("b")))
    byte_decoder[a], byte_decoder[b] = byte_decoder[b], byte_decoder[a]
    assert ByteTable.for_tokenizer(tokenizer.hf.backend_tokenizer, byte_decoder) is None


def test_token_bytes_come_from_the_table_and_read_as_the_byte_map_does(tokenizer: PromptTokenizer) -> None:
    """Logprobs' `bytes`: a vocabulary piece mapped back through the ByteLevel
    byte map, an added token written as plain text as its UTF-8."""
    for tok in _tokenizers(tokenizer):
        size = tok._fast.get_vocab_size(with_added_tokens=True)
        byte_map = tok._byte_decoder
        assert byte_map is not None
        for token_id in range(size):
            piece = tok._fast.id_to_token(token_id)
            if all(c in byte_map for c in piece):
                expected = [byte_map[c] for c in piece]
            else:
                expected = list(tok.token_text(token_id).encode("utf-8"))
            assert tok.token_bytes(token_id) == expected, token_id
        assert tok._byte_table is not None and tok._byte_table.token_bytes(size) is None
