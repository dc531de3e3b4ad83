"""Big prompts rendered and tokenized in a separate process.

Why a process and not a thread: the Rust tokenizer releases the GIL while it
works, but the steps around it do not, and some are single C calls nothing
can interrupt (`Encoding.ids` builds a Python list of every id: 16-23 ms
for 1.3M tokens here), while the encoder itself takes the GIL back in 5 ms
bursts, tens of times a second. Each time the event loop releases the GIL
(a socket write, `os.urandom`) it then waits for one of those. Measured
with a 3.5 MB prompt and 32 small streams: the small streams' worst latency
rose by 120-190 ms (docs/benchmarks.md). In a process of its own the
tokenizer shares no GIL with the loop: the ids come back as one int32
buffer, and the loop turns them into the job's list in slices.

`ProcessTokenizer(model_dir)` loads the same tokenizer (`PromptTokenizer.
from_dir`) in one child process, started on the first big prompt (spawned:
no fork of a threaded process). A refusal in the child (too long, a
conversation the template cannot render) comes back as the same
`InvalidRequest`. If the child dies, `encode` raises `ProcessUnavailable`
(the caller tokenizes in a thread instead) and the next call starts a new
one. `close()` stops the child. As with any spawned process, the program's
main module must guard its start-up with `if __name__ == "__main__":`
(the console scripts and `python -m` entry points do).
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import numpy as np

from gateway.http.errors import InvalidRequest

log = logging.getLogger(__name__)
NICE = 10  # the child's niceness, added to the gateway's
_TOKENIZER: Any = None  # the child's PromptTokenizer


class ProcessUnavailable(Exception):
    """The tokenizer's process died; the caller tokenizes another way."""


def _load(model_dir: str, parent: int) -> None:
    global _TOKENIZER
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # A parent killed outright never says goodbye: without this the child
    # (hundreds of MB) outlives it, an orphan.
    threading.Thread(target=_exit_with, args=(parent,), name="parent-watch", daemon=True).start()
    # Bulk work: a big prompt's seconds of tokenizing take only the CPU the
    # event loop leaves (on the gateway's own core they halved its share).
    os.nice(NICE)
    from gateway.serving.tokenize import PromptTokenizer

    _TOKENIZER = PromptTokenizer.from_dir(model_dir)


def _exit_with(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


def _loaded() -> bool:
    return _TOKENIZER is not None


def _tokenize(
    messages: list[dict[str, Any]] | None,
    tools: list[dict[str, Any]] | None,
    template_kwargs: dict[str, Any],
    text: str | None,
    max_tokens: int | None,
) -> tuple[str, Any, Any, Any]:
    """In the child: ("ok", int32 ids as bytes, None, None) or ("error", message, param, code)."""
    tok = _TOKENIZER
    try:
        if messages is not None:
            ids = tok.encode_chat(messages, tools=tools, template_kwargs=template_kwargs, max_tokens=max_tokens)
        else:
            ids = tok.encode_text(text or "", max_tokens=max_tokens)
    except InvalidRequest as exc:
        return "error", exc.message, exc.param, exc.code
    return "ok", np.asarray(ids, dtype=np.int32).tobytes(), None, None


class ProcessTokenizer:
    """One child process that tokenizes what `turn.tokens.PromptTokens` gives it (see the module doc)."""

    def __init__(self, model_dir: str) -> None:
        self.model_dir = model_dir
        self._pool: ProcessPoolExecutor | None = None

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                max_workers=1,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_load,
                initargs=(self.model_dir, os.getpid()),
            )
        return self._pool

    async def encode(
        self,
        *,
        messages: list[dict[str, Any]] | None = None,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
        text: str | None = None,
        max_tokens: int | None = None,
    ) -> np.ndarray:
        """The prompt's token ids (template applied for `messages`), int32, read-only."""
        loop = asyncio.get_running_loop()
        args = (messages, tools, dict(template_kwargs or {}), text, max_tokens)
        try:
            status, value, param, code = await loop.run_in_executor(self._executor(), _tokenize, *args)
        except BrokenProcessPool as exc:  # the child died (killed, or it could not start): a new one next time
            self._pool = None
            log.error("the tokenizer's process is gone (%s); this prompt is tokenized in a thread", exc)
            raise ProcessUnavailable(str(exc)) from exc
        if status == "error":
            raise InvalidRequest(value, param=param, code=code)
        return np.frombuffer(value, dtype=np.int32)

    async def warm(self) -> bool:
        """Start the process now and wait until its tokenizer is loaded (seconds),
        instead of at the first big prompt. False (logged) if it could not start."""
        try:
            return bool(await asyncio.wrap_future(self._executor().submit(_loaded)))
        except BrokenProcessPool as exc:
            self._pool = None
            log.error("the tokenizer's process did not start (%s); big prompts start it again", exc)
            return False

    def close(self) -> None:
        """Stop the child now. `shutdown(wait=False)` alone left it running for
        10+ s in some runs; it holds nothing worth waiting for, so it is
        terminated (the executor keeps its processes in `_processes`)."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        children = list(getattr(pool, "_processes", {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for child in children:
            child.terminate()
