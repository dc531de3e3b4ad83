"""A tiny byte-level BPE tokenizer with the demo model's stock chat template, built in a
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

    from workers.tiny_model import BOS, EOS, PAD, SPECIAL_TOKENS, chat_template

    out = pathlib.Path(directory)
    if (out / "tokenizer.json").exists() and (out / "config.json").exists():
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
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        chat_template=chat_template(),
    ).save_pretrained(out)
    # A model config (no weights): the gateway renders chats through vLLM, whose
    # ModelConfig reads it.
    from transformers import LlamaConfig

    LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        # no context limit worth the name: tests and `bench gateway` set theirs explicitly
        max_position_embeddings=2**24,
    ).save_pretrained(out)
    return out
