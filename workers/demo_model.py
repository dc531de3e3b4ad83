"""The demo model: a tiny Llama-architecture model built locally, no download.

`init_demo(dir)` writes a normal Hugging Face model folder: config, seeded
random bf16 weights (safetensors), a byte-level BPE tokenizer trained here on
text that ships with Python (its standard library's docstrings), and a chat
template that renders system/user/assistant/tool messages and tool schemas.
The weights are random, so the text is nonsense; everything else (shapes,
grouped-query attention, tokenizer, template, greedy determinism) is real.
"""

from __future__ import annotations

import json
import pathlib
import sysconfig
from dataclasses import dataclass

SPECIAL_TOKENS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header|>", "<|end_header|>", "<|eot|>", "<|pad|>"]

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}<|start_header|>system<|end_header|>\nYou can call these tools:\n"
    "{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|eot|>{% endif %}"
    "{% for m in messages %}"
    "<|start_header|>{{ m['role'] }}{% if m.get('name') %}:{{ m['name'] }}{% endif %}<|end_header|>\n"
    "{% if m['content'] is string %}{{ m['content'] }}"
    "{% elif m['content'] %}{% for part in m['content'] %}"
    "{% if part.get('text') %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{% if m.get('tool_calls') %}{% for c in m['tool_calls'] %}"
    "\n<tool_call>{{ c['function'] | tojson }}</tool_call>{% endfor %}{% endif %}"
    "<|eot|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header|>assistant<|end_header|>\n{% endif %}"
)


@dataclass(frozen=True)
class DemoModelConfig:
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


def _train_tokenizer(cfg: DemoModelConfig):
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
        bos_token="<|begin_of_text|>",
        eos_token="<|eot|>",
        pad_token="<|pad|>",
        chat_template=CHAT_TEMPLATE,
    )


def init_demo(directory: str | pathlib.Path, cfg: DemoModelConfig = DemoModelConfig()) -> pathlib.Path:
    """Write the demo model folder; idempotent (an existing complete folder is kept)."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    out = pathlib.Path(directory)
    if (out / "config.json").exists() and (out / "tokenizer.json").exists() and (out / "model.safetensors").exists():
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
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    # Larger logits spread than the default init makes greedy decoding less
    # prone to ending at once, so streams have tokens to compare.
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, 0.2)
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id).save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "DEMO_MODEL.json").write_text(json.dumps({"seed": cfg.seed, "note": "random weights, local tokenizer"}))
    return out
