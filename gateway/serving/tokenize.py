"""Prompt rendering and tokenization with the model's own HF tokenizer.

The gateway applies the chat template (tools included) and tokenizes once;
workers receive token ids only. Output text is rebuilt here from token ids
(`gateway.serving.detokenize`), so a stream resumed on another node continues
the same text with no gap and no duplicated character.

Prompts longer than `max_prompt_tokens` are refused (400
`context_length_exceeded`). For a lossless tokenizer (decode(encode(x)) == x:
byte-level BPE, SentencePiece with byte fallback) every token covers at most
`max_token_bytes` of the text, so a text of more than `limit x
max_token_bytes` characters cannot fit and is refused before it is
tokenized (O(1)); otherwise the limit is checked on the token count.

Thread safety: `encode_*` may run in worker threads (the service tokenizes
big prompts off the event loop); the Rust tokenizer's `encode_batch_fast`
releases the GIL while it works (`encode` holds it for the whole call).

`PromptTokenizer.from_dir` is the only place that touches the filesystem.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Sequence
from typing import Any

from gateway.http.errors import InvalidRequest
from gateway.serving.chat_render import ChatRenderer
from gateway.serving.detokenize import ByteTable, Detokenizer, IncrementalDetokenizer
from gateway.serving.token_pieces import PieceEncoder

# Text a lossless tokenizer gives back unchanged: runs of spaces and tabs,
# newlines, a control character, a decomposed accent, CJK, a no-break space.
_ROUND_TRIP_PROBE = "  a\tb\n\n   \x01 e\u0301 é 日本語 \u00a0 x  \r\n"


class PromptTokenizer:
    def __init__(self, hf_tokenizer: Any, *, context_length: int | None = None, model_dir: str | None = None) -> None:
        if not getattr(hf_tokenizer, "chat_template", None):
            raise ValueError("tokenizer has no chat_template")
        self._hf = hf_tokenizer
        # Messages reach the template as vLLM's server gives them (gateway.serving.chat_render).
        self._renderer = ChatRenderer(hf_tokenizer, model_dir or hf_tokenizer.name_or_path)
        # The Rust tokenizer behind the HF wrapper: decode without Python overhead.
        self._fast = hf_tokenizer.backend_tokenizer
        self.eos_token_id: int | None = hf_tokenizer.eos_token_id
        self.vocab_size: int = len(hf_tokenizer)
        # The model's own context length (config.json), when known: no prompt beyond it can be served.
        self.context_length = context_length
        # Upper bound on the characters one token covers (UTF-8 bytes of its vocabulary
        # string: at least the bytes it stands for), or None when the tokenizer is lossy
        # and a text's length says nothing about its token count.
        self.max_token_chars: int | None = None
        if self._fast.decode(self._encode(_ROUND_TRIP_PROBE, False), skip_special_tokens=False) == _ROUND_TRIP_PROBE:
            self.max_token_chars = max(len(t.encode()) for t in self._fast.get_vocab(with_added_tokens=True))
        # Chat prompts tokenized piece by piece between the template's special tokens, the
        # pieces remembered (gateway.serving.token_pieces); None where that cut is not exact.
        self.pieces = PieceEncoder.for_tokenizer(self._fast)
        self._byte_decoder: dict[str, int] | None = None
        if type(self._fast.decoder).__name__ == "ByteLevel":
            from transformers.convert_slow_tokenizer import bytes_to_unicode

            self._byte_decoder = {c: b for b, c in bytes_to_unicode().items()}
        # Streamed text from each token's bytes where that is exact (gateway.serving.detokenize):
        # built here, not at the first request (~0.1 s for a 49k vocabulary).
        self._byte_table = ByteTable.for_tokenizer(self._fast, self._byte_decoder)
        self.detokenizer(skip_special_tokens=False)  # its table without EOS, made now too

    @property
    def hf(self) -> Any:
        """The Hugging Face tokenizer (what vLLM's parsers take)."""
        return self._hf

    @classmethod
    def from_dir(cls, model_dir: str) -> PromptTokenizer:
        from transformers import AutoTokenizer

        return cls(
            AutoTokenizer.from_pretrained(model_dir),
            context_length=model_context_length(model_dir),
            model_dir=model_dir,
        )

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        tool_choice: Any = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The prompt text for `messages`, ending with the assistant header.

        `template_kwargs` reach the template as variables (vLLM's
        `chat_template_kwargs`, e.g. `reasoning_effort`)."""
        return self._renderer.render(messages, tools=tools, tool_choice=tool_choice, template_kwargs=template_kwargs)

    def encode_chat(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        tool_choice: Any = None,
        template_kwargs: dict[str, Any] | None = None,
        max_tokens: int | None = None,
        scope: str | None = None,
    ) -> list[int]:
        """The rendered prompt's ids. `scope` (a tenant's cache salt): its pieces
        between special tokens may come from, and go to, that scope's cache."""
        # The template writes the special tokens (bos) itself.
        return self.encode_text(
            self.render_chat(messages, tools=tools, tool_choice=tool_choice, template_kwargs=template_kwargs),
            add_special_tokens=False,
            max_tokens=max_tokens,
            param="messages",
            scope=scope,
        )

    def encode_text(
        self,
        text: str,
        *,
        add_special_tokens: bool = True,
        max_tokens: int | None = None,
        param: str = "prompt",
        scope: str | None = None,
    ) -> list[int]:
        """Token ids of `text`; `max_tokens`: refuse (400, naming `param`) a prompt longer than that.
        `scope`: pieces cached per scope (as `encode_chat`; only without special tokens added)."""
        if max_tokens is not None and self.max_token_chars is not None:
            at_least = -(-len(text) // self.max_token_chars)
            if at_least > max_tokens:
                raise _too_long(max_tokens, f"at least {at_least}", param)
        if scope is not None and self.pieces is not None and not add_special_tokens:
            ids = self.pieces.encode(text, scope=scope)
        else:
            ids = self._encode(text, add_special_tokens)
        if max_tokens is not None and len(ids) > max_tokens:
            raise _too_long(max_tokens, str(len(ids)), param)
        return ids

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        # The batch entry point: releases the GIL and skips the offsets (same ids as `encode`).
        return self._fast.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0].ids

    def decode(self, token_ids: Sequence[int]) -> str:
        return self._fast.decode(list(token_ids), skip_special_tokens=True)

    def decode_keeping_special(self, token_ids: Sequence[int]) -> str:
        """Special tokens kept (a tool parser may need them), except EOS,
        which ends the output rather than belonging to it (as in vLLM)."""
        eos = self.eos_token_id
        return self._fast.decode([t for t in token_ids if t != eos], skip_special_tokens=False)

    def token_text(self, token_id: int) -> str:
        """One token's text, special tokens included (logprobs entries)."""
        return self._fast.decode([token_id], skip_special_tokens=False)

    def token_bytes(self, token_id: int) -> list[int]:
        """One token's raw bytes (logprobs entries): a byte-level BPE token
        can be part of a UTF-8 character, which its text cannot show. From
        the byte table where the tokenizer has one (its bytes are checked
        against the tokenizer's decode), else mapped here."""
        data = self._byte_table.token_bytes(token_id) if self._byte_table is not None else None
        if data is not None:
            return list(data)
        if self._byte_decoder is not None:
            piece = self._hf.convert_ids_to_tokens(token_id)
            if isinstance(piece, str) and all(c in self._byte_decoder for c in piece):
                return [self._byte_decoder[c] for c in piece]
        return list(self.token_text(token_id).encode("utf-8"))

    def detokenizer(self, *, skip_special_tokens: bool = True) -> Detokenizer:
        """Special tokens skipped, or kept but for EOS (as `decode_keeping_special`);
        from the byte table where the tokenizer has one (gateway.serving.detokenize)."""
        table = self._byte_table
        eos = frozenset(() if skip_special_tokens or self.eos_token_id is None else (self.eos_token_id,))
        if table is not None:
            return table.detokenizer(skip_special_tokens=skip_special_tokens, skip=eos)
        return IncrementalDetokenizer(self._fast, skip_special_tokens=skip_special_tokens, skip=eos)


def _too_long(limit: int, tokens: str, param: str) -> InvalidRequest:
    return InvalidRequest(
        f"This model's maximum context length is {limit} tokens; the prompt has {tokens} tokens.",
        param=param,
        code="context_length_exceeded",
    )


def model_sampling_defaults(model_dir: str) -> dict[str, float | int]:
    """The sampling defaults in the model's generation_config.json (temperature,
    top_p, top_k, min_p, repetition_penalty), as vLLM's server applies them."""
    path = pathlib.Path(model_dir) / "generation_config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(config, dict):
        return {}
    keys = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
    return {k: config[k] for k in keys if isinstance(config.get(k), (int, float)) and not isinstance(config[k], bool)}


def model_context_length(model_dir: str) -> int | None:
    """`max_position_embeddings` (or `max_sequence_length`) of the model's config.json, if any."""
    path = pathlib.Path(model_dir) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    for key in ("max_position_embeddings", "max_sequence_length", "n_positions"):
        value = config.get(key) if isinstance(config, dict) else None
        if isinstance(value, int) and value > 0:
            return value
    return None


class StopStringFilter:
    """Cuts the text stream at the first stop string (not included).

    Holds back up to `max(len(stop)) - 1` characters that may begin a stop
    string, so a stop spanning two deltas (or two nodes, after a resume) is
    still caught. `stopped` becomes True once a stop string is seen.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = [s for s in stops if s]
        self._hold = max((len(s) for s in self._stops), default=1) - 1
        self._buf = ""
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended the text

    def push(self, text: str) -> str:
        if self.stopped:
            return ""
        if not self._stops:
            return text
        self._buf += text
        hits = [(i, s) for s in self._stops if (i := self._buf.find(s)) >= 0]
        if hits:
            cut, self.matched = min(hits)
            self.stopped = True
            out, self._buf = self._buf[:cut], ""
            return out
        if len(self._buf) <= self._hold:
            return ""
        out, self._buf = self._buf[: len(self._buf) - self._hold], self._buf[len(self._buf) - self._hold :]
        return out

    def flush(self) -> str:
        out, self._buf = ("" if self.stopped else self._buf), ""
        return out
