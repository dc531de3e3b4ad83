"""Where a prompt is tokenized, and its block hashes computed.

No request may stall the others: a prompt of `offload_chars` characters or
more is rendered and tokenized in a worker thread (the Rust tokenizer
releases the GIL), and its block hashes are computed on the loop in slices
of `_HASH_SLICE_BLOCKS` blocks with a yield between them. Small prompts
stay inline: the thread hop costs more than their tokenization. A prompt of
`process_chars` or more goes to the tokenizer's own process when the app
gave one (`tokenize_process`): in a thread, the GIL the tokenizer takes back
in bursts stalled the loop for 100+ ms on a 3.5 MB prompt.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import numpy as np

from gateway.http.errors import InvalidRequest
from gateway.kv.directory import Directory
from gateway.serving.tokenize_process import ProcessTokenizer, ProcessUnavailable
from gateway.serving.turn.model import ServedModel
from gateway.serving.turn.spec import TurnSpec
from gateway.telemetry import end_span, start_span

# Blocks hashed per slice of a big prompt (~3 ms on the loop at a time here).
_HASH_SLICE_BLOCKS = 1024


def prompt_chars(spec: TurnSpec) -> int:
    """About how many characters the prompt is made of (decides where it is tokenized)."""
    if spec.messages is None:
        return len(spec.prompt) if isinstance(spec.prompt, str) else 0  # token ids: nothing to tokenize
    return _chars(spec.messages) + _chars(spec.tools)


def _chars(value: object) -> int:
    """The characters of every string in a JSON-like value (no copy of the text)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(_chars(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(_chars(v) for v in value)
    return 0


class PromptTokens:
    """A spec's prompt as token ids and block hashes (see the module docstring)."""

    def __init__(
        self,
        model: ServedModel,
        directory: Directory,
        *,
        offload_chars: int = 16 * 1024,
        tokenize_threads: int = 2,
        process_tokenizer: ProcessTokenizer | None = None,
        process_chars: int = 256 * 1024,
    ) -> None:
        self.model = model
        self.directory = directory
        self.offload_chars = offload_chars
        self._pool = ThreadPoolExecutor(max_workers=tokenize_threads, thread_name_prefix="tokenize")
        self.process_tokenizer = process_tokenizer
        self.process_chars = process_chars

    async def encode(self, spec: TurnSpec, salt: str) -> tuple[list[int], list[str]]:
        chars = prompt_chars(spec)
        span = start_span("tokenize", **{"evolving.prompt_chars": chars})  # template + tokens + block hashes
        if chars < self.offload_chars:
            tokens = self.tokens(spec, salt)
            hashes = self.directory.block_hashes(tokens, salt)
        elif chars >= self.process_chars and self.process_tokenizer is not None:
            try:
                tokens, hashes = await self._in_process(self.process_tokenizer, spec, salt)
            except ProcessUnavailable:
                tokens, hashes = await self._in_thread(spec, salt)
        else:
            tokens, hashes = await self._in_thread(spec, salt)
        sizes: dict[str, Any] = {"gen_ai.usage.input_tokens": len(tokens), "evolving.prompt_blocks": len(hashes)}
        end_span(span, **sizes)
        return tokens, hashes

    def tokens(self, spec: TurnSpec, salt: str | None = None) -> list[int]:
        """The prompt's token ids (template applied); refuses empty and too long prompts.
        `salt` (the tenant's cache salt): the scope of the tokenizer's piece cache."""
        if spec.messages is not None:
            tokens = self.model.tokenizer.encode_chat(
                spec.messages,
                tools=spec.tools,
                template_kwargs=spec.template_kwargs,
                max_tokens=self.model.max_prompt_tokens,
                scope=salt,
            )
        else:
            tokens = self._completion_tokens(spec.prompt)
        if not tokens:
            raise InvalidRequest("the prompt is empty after tokenization", param="prompt")
        return tokens

    def _completion_tokens(self, prompt: str | list[int] | None) -> list[int]:
        limit = self.model.max_prompt_tokens
        if prompt is None:
            return []
        if isinstance(prompt, str):
            return self.model.tokenizer.encode_text(prompt, max_tokens=limit)
        ids = [int(t) for t in prompt]
        if any(t < 0 or t >= self.model.tokenizer.vocab_size for t in ids):
            raise InvalidRequest("prompt token id out of the vocabulary", param="prompt")
        if limit is not None and len(ids) > limit:
            raise InvalidRequest(
                f"This model's maximum context length is {limit} tokens; the prompt has {len(ids)} tokens.",
                param="prompt",
                code="context_length_exceeded",
            )
        return ids

    async def _in_thread(self, spec: TurnSpec, salt: str) -> tuple[list[int], list[str]]:
        tokens = await asyncio.get_running_loop().run_in_executor(self._pool, self.tokens, spec, salt)
        return tokens, await self._hash_in_slices(tokens, salt)

    async def _in_process(self, proc: ProcessTokenizer, spec: TurnSpec, salt: str) -> tuple[list[int], list[str]]:
        """`tokens` in the tokenizer's process; the ids become the job's list
        and its block hashes here, in slices, yielding to the loop between them.
        (A prompt of token ids counts no characters: it never comes here.)"""
        ids = await proc.encode(
            messages=spec.messages,
            tools=spec.tools,
            template_kwargs=spec.template_kwargs,
            text=spec.prompt if spec.messages is None and isinstance(spec.prompt, str) else None,
            max_tokens=self.model.max_prompt_tokens,
        )
        if len(ids) == 0:
            raise InvalidRequest("the prompt is empty after tokenization", param="prompt")
        step = _HASH_SLICE_BLOCKS * self.directory.block_size
        tokens: list[int] = []
        hashes: list[str] = []
        for start in range(0, len(ids), step):
            end = min(start + step, len(ids))
            tokens.extend(ids[start:end].tolist())
            # an int64 array reads as a sequence of ints (the hashers take either)
            hashes = self.directory.block_hashes(cast("Sequence[int]", ids[:end]), salt, known=hashes)
            if end < len(ids):
                await asyncio.sleep(0)
        return tokens, hashes

    async def _hash_in_slices(self, tokens: list[int], salt: str) -> list[str]:
        """`directory.block_hashes(tokens, salt)`, yielding to the loop between slices.

        The ids become an int64 array here, slice by slice, not in the
        tokenizing thread: one `np.asarray` of a million-element list holds
        the GIL for ~26 ms in a single C call, which no thread switch can
        interrupt, and the loop waited for it (docs/benchmarks.md)."""
        step = _HASH_SLICE_BLOCKS * self.directory.block_size
        array = np.empty(len(tokens), dtype=np.int64)
        hashes: list[str] = []
        for start in range(0, len(tokens), step):
            end = min(start + step, len(tokens))
            array[start:end] = tokens[start:end]
            hashes = self.directory.block_hashes(cast("Sequence[int]", array[:end]), salt, known=hashes)
            if end < len(tokens):
                await asyncio.sleep(0)
        return hashes

    def close(self) -> None:
        """Stop the tokenizer's process, if one was started (the app's shutdown)."""
        if self.process_tokenizer is not None:
            self.process_tokenizer.close()
