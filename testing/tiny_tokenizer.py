"""A tiny byte-level BPE tokenizer with the demo chat template, built in a
second (no model weights). For tests and `bench gateway`, which need the
gateway's tokenization path but not a model.
"""

from __future__ import annotations

import pathlib

_TEXT = [
    "The gateway applies the chat template and tokenizes once with the model's own tokenizer.",
    "Agents call tools, read their results and continue the conversation with a cached prefix.",
    "Prefill computes the prompt; decode streams one token at a time until the end.",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
    '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
    "Numbers 0 1 2 3 4 5 6 7 8 9 and punctuation , . ; : ! ? ( ) [ ] { } < > = + - * / \" '",
    "héllo wörld — ünïcode ✓ 日本語 テキスト",
] * 4


def write_tiny_tokenizer(directory: str | pathlib.Path, vocab_size: int = 800) -> pathlib.Path:
    """Write tokenizer files (with a chat template) to `directory`; idempotent."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from workers.demo_model import SPECIAL_TOKENS, chat_template

    out = pathlib.Path(directory)
    if (out / "tokenizer.json").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_TEXT, trainer=trainer)
    PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|begin_of_text|>",
        eos_token="<|eot|>",
        pad_token="<|pad|>",
        chat_template=chat_template(),
    ).save_pretrained(out)
    return out
