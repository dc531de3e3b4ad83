"""The tiny test model: a small Llama-architecture model built locally, no download.

`init_tiny(dir)` writes a normal Hugging Face model folder: config, seeded
random bf16 weights (safetensors), a byte-level BPE tokenizer trained here on
text that ships with Python (its standard library's docstrings), and the
demo model's **stock** ChatML chat template (SmolLM2-Instruct's, read from
its GGUF: workers.demo_model), so tests meet no tolerance a real template
lacks: content must reach it as a string, tools are not rendered.
The weights are random, so the text is nonsense; everything else (shapes,
grouped-query attention, tokenizer, template, greedy determinism) is real.
Fast tests serve it; `make demo` serves the real model.
"""

from __future__ import annotations

import json
import pathlib
import sysconfig
from dataclasses import dataclass

from workers.demo_model import readable_by_all, stock_chat_template

# ChatML's markers, as SmolLM2's tokenizer has them (`<|im_end|>` ends a turn: the EOS).
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
BOS, EOS, PAD = "<|im_start|>", "<|im_end|>", "<|pad|>"
MARKER = "TINY_MODEL.json"


def chat_template() -> str:
    """The tiny model's chat template: the demo model's stock one."""
    return stock_chat_template()


@dataclass(frozen=True)
class TinyModelConfig:
    vocab_size: int = 4096  # BPE merges stop here
    hidden_size: int = 128
    intermediate_size: int = 384
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2  # grouped-query attention
    max_positions: int = 8192
    seed: int = 0


def _corpus(limit_bytes: int = 4_000_000) -> list[str]:
    """Text for the tokenizer: the installed standard library's sources."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    out, size = [], 0
    for path in sorted(root.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="ignore")
        out.append(text)
        size += len(text)
        if size >= limit_bytes:
            break
    return out


def _train_tokenizer(cfg: TinyModelConfig):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=cfg.vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        chat_template=chat_template(),
    )


def init_tiny(directory: str | pathlib.Path, cfg: TinyModelConfig = TinyModelConfig()) -> pathlib.Path:
    """Write the demo model folder; idempotent (an existing complete folder is kept)."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    out = pathlib.Path(directory)
    if all((out / name).exists() for name in ("config.json", "tokenizer.json", "model.safetensors", MARKER)):
        return out
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _train_tokenizer(cfg)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_positions,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        dtype="bfloat16",
    )
    torch.manual_seed(cfg.seed)
    # transformers wraps `to` in a decorator typed for the model argument only.
    model = LlamaForCausalLM(config).to(torch.bfloat16)  # type: ignore[arg-type]
    # Larger logits spread than the default init makes greedy decoding less
    # prone to ending at once, so streams have tokens to compare.
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, 0.2)
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id).save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / MARKER).write_text(json.dumps({"seed": cfg.seed, "note": "random weights, local tokenizer"}))
    readable_by_all(out)
    return out
