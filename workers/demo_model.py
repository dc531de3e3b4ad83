"""The demo model: a tiny Llama-architecture model built locally, no download.

`init_demo(dir)` writes a normal Hugging Face model folder: config, seeded
random bf16 weights (safetensors), a byte-level BPE tokenizer trained here on
text that ships with Python (its standard library's docstrings), and a chat
template in the Hermes tool format (`demo_chat_template.jinja`): system,
user, assistant and tool messages, tool schemas, and `<tool_call>` blocks
that vLLM's `hermes` tool parser reads back.
The weights are random, so the text is nonsense; everything else (shapes,
grouped-query attention, tokenizer, template, greedy determinism) is real.
"""

from __future__ import annotations

import json
import pathlib
import sysconfig
from dataclasses import dataclass

SPECIAL_TOKENS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header|>", "<|end_header|>", "<|eot|>", "<|pad|>"]

# Hermes-style tool format, which vLLM's `hermes` tool parser reads back
# (`--tool-call-parser hermes`, the gateway's default): system and developer
# text plus the tools' signatures in one system turn; an assistant's calls as
# `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` (arguments as
# an object, whether the message carries them as a dict or as OpenAI's JSON
# string); consecutive tool results as one user turn of `<tool_response>`s.
# `<tool_call>` stays ordinary text (no special token): the gateway decodes
# with special tokens skipped, and the parser and grammar work on text.
TEMPLATE_FILE = "demo_chat_template.jinja"  # beside this module (package data)


def chat_template() -> str:
    """The demo model's chat template (workers/demo_chat_template.jinja)."""
    return (pathlib.Path(__file__).with_name(TEMPLATE_FILE)).read_text(encoding="utf-8")


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
        chat_template=chat_template(),
    )


def init_demo(directory: str | pathlib.Path, cfg: DemoModelConfig = DemoModelConfig()) -> pathlib.Path:
    """Write the demo model folder; idempotent (an existing complete folder is kept)."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    out = pathlib.Path(directory)
    if (out / "config.json").exists() and (out / "tokenizer.json").exists() and (out / "model.safetensors").exists():
        refresh_chat_template(out)
        _readable_by_all(out)
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
    _readable_by_all(out)
    return out


def _readable_by_all(out: pathlib.Path) -> None:
    """save_pretrained writes model.safetensors as 0600; the chart's containers
    run as uid 10001 and must read a model folder that root prepared."""
    for path in out.iterdir():
        if path.is_file():
            path.chmod(path.stat().st_mode | 0o444)


def refresh_chat_template(directory: str | pathlib.Path) -> bool:
    """Bring an existing demo folder's chat template up to `chat_template()`
    (weights and tokenizer stay). True when it changed something."""
    out = pathlib.Path(directory)
    if not (out / "DEMO_MODEL.json").exists():
        return False  # not a demo model folder: never touch a real model's template
    template = chat_template()
    changed = False
    jinja = out / "chat_template.jinja"
    if not jinja.exists() or jinja.read_text(encoding="utf-8") != template:
        jinja.write_text(template, encoding="utf-8")
        changed = True
    config_path = out / "tokenizer_config.json"
    if config_path.exists():
        config = json.loads(config_path.read_text(encoding="utf-8"))
        if "chat_template" in config and config["chat_template"] != template:
            config["chat_template"] = template
            config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")
            changed = True
    return changed
