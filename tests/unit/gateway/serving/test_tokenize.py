"""PromptTokenizer: same ids as the HF tokenizer, context-length refusals
(before tokenizing when the text alone proves the prompt too long), the
model's context length from its config."""

from __future__ import annotations

import json
import pathlib
import random

import pytest
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from gateway.http.errors import InvalidRequest
from gateway.serving.tokenize import PromptTokenizer, model_context_length

TEXTS = ["Agents call tools.", "héllo wörld — ✓ 日本語", "  spaces\tand\nnewlines  ", "<|begin_of_text|>x"]


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("special", [True, False])
def test_ids_are_the_hf_tokenizers(tokenizer_dir: pathlib.Path, text: str, special: bool) -> None:
    hf = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    tok = PromptTokenizer(hf)
    assert tok.encode_text(text, add_special_tokens=special) == hf.encode(text, add_special_tokens=special)


def test_a_text_too_long_to_fit_is_refused_without_tokenizing(tokenizer: PromptTokenizer, monkeypatch) -> None:
    assert tokenizer.max_token_chars is not None  # byte-level BPE round-trips: the bound holds
    limit = 100
    monkeypatch.setattr(tokenizer, "_encode", lambda *a: pytest.fail("tokenized a text that cannot fit"))
    text = "x" * (limit * tokenizer.max_token_chars + 1)
    with pytest.raises(InvalidRequest) as err:
        tokenizer.encode_text(text, max_tokens=limit)
    assert err.value.code == "context_length_exceeded" and err.value.param == "prompt"
    assert "at least 101" in err.value.message
    with pytest.raises(InvalidRequest) as chat:
        tokenizer.encode_chat([{"role": "user", "content": text}], max_tokens=limit)
    assert chat.value.param == "messages"


def test_a_prompt_over_the_limit_is_refused_after_counting(tokenizer: PromptTokenizer) -> None:
    text = "Agents call tools, read their results and continue. " * 20
    n = len(tokenizer.encode_text(text))
    assert tokenizer.encode_text(text, max_tokens=n) == tokenizer.encode_text(text)
    with pytest.raises(InvalidRequest, match=f"has {n} tokens") as err:
        tokenizer.encode_text(text, max_tokens=n - 1)
    assert err.value.code == "context_length_exceeded"


def test_the_bound_never_refuses_what_fits(tokenizer: PromptTokenizer) -> None:
    """Texts made of the longest tokens: the count is at least len / max_token_chars."""
    assert tokenizer.max_token_chars is not None
    for text in TEXTS + ["\n" + " " * 300, "ĠĠĠĠ" * 50, "é" * 500]:
        n = len(tokenizer.encode_text(text, add_special_tokens=False))
        assert n >= len(text) / tokenizer.max_token_chars
        assert tokenizer.encode_text(text, add_special_tokens=False, max_tokens=n)


def test_a_lossy_tokenizer_gets_no_length_bound(tmp_path: pathlib.Path) -> None:
    """A lowercasing, whitespace-dropping tokenizer: a text's length says nothing about its tokens."""
    vocab = {"[UNK]": 0, "a": 1, "b": 2}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    raw.normalizer = normalizers.Lowercase()
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    hf = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]", chat_template="{{ messages[0].content }}")
    tok = PromptTokenizer(hf)
    assert tok.max_token_chars is None
    assert tok.encode_text("A    b", max_tokens=2) == [1, 2]  # counted, not refused by length


def test_context_length_comes_from_the_model_config(tmp_path: pathlib.Path) -> None:
    assert model_context_length(str(tmp_path)) is None
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 8192}))
    assert model_context_length(str(tmp_path)) == 8192
    (tmp_path / "config.json").write_text("not json")
    assert model_context_length(str(tmp_path)) is None


@pytest.mark.parametrize("skip_special", [True, False])
def test_streamed_text_is_the_full_decode_for_any_ids_and_grouping(tokenizer: PromptTokenizer, skip_special) -> None:
    """Random ids (split characters, special tokens, EOS) pushed in random groups:
    the deltas and the flush add up to one decode of them all."""
    rnd = random.Random(7)
    full = tokenizer.decode if skip_special else tokenizer.decode_keeping_special
    for _ in range(200):
        ids = [rnd.randrange(tokenizer.vocab_size) for _ in range(rnd.randrange(1, 40))]
        if tokenizer.eos_token_id is not None and rnd.random() < 0.3:
            ids.insert(rnd.randrange(len(ids) + 1), tokenizer.eos_token_id)
        detok = tokenizer.detokenizer(skip_special_tokens=skip_special)
        out, i = [], 0
        while i < len(ids):
            k = rnd.randrange(1, 4)
            out.append(detok.push(ids[i : i + k]))
            i += k
        assert "".join(out) + detok.flush() == full(ids)
