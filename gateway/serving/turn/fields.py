"""Request-field rules every API shares (pure): tool names, logit bias,
error paths, and vLLM's request objects as plain JSON values."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel

from workers.protocol import MAX_LOGIT_BIAS

NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"
_UNION_TAGS = frozenset({"str", "int", "float", "bool", "dict", "list", "list[int]", "list[str]"})


def field_path(loc: tuple[Any, ...] | list[Any]) -> str:
    """A pydantic error location as the field path the client sent: unions add
    their member's tag ("function-after[...]", "literal['none','auto']",
    "str", "NamedToolChoice"), which is left out."""
    parts = [str(p) for p in loc]
    return ".".join(
        p for p in parts if not (p[:1].isupper() or "[" in p or p.startswith("function-") or p in _UNION_TAGS)
    )


def check_logit_bias(value: dict[str, float] | None) -> dict[str, float] | None:
    """OpenAI's rule: keys are token ids (as strings), values in [-100, 100]."""
    if value is None:
        return None
    if len(value) > MAX_LOGIT_BIAS:
        raise ValueError(f"logit_bias may bias at most {MAX_LOGIT_BIAS} tokens")
    for key, bias in value.items():
        if not key.isdigit():
            raise ValueError(f"logit_bias keys must be token ids, not {key!r}")
        if not -100.0 <= bias <= 100.0:
            raise ValueError(f"logit_bias values must be in [-100, 100], not {bias}")
    return value


def plain(value: Any) -> Any:
    """vLLM's mix of TypedDicts, pydantic models and iterators as plain JSON values."""
    if isinstance(value, BaseModel):
        return plain(value.model_dump(exclude_none=True))
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)) or (isinstance(value, Iterable) and not isinstance(value, (str, bytes))):
        return [plain(v) for v in value]
    return value
