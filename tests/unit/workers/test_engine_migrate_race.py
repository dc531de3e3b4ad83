"""A migration asked for while the engine is already finishing a decode ends
the request as the engine did (issue 31: `bench chaos` saw a stop token
followed by text, `' output.<|im_end|>\\n<|im_start|>user\\n'`: the worker
had called the finished request MIGRATED, and its continuation elsewhere
generated past the stop token). A fake AsyncLLM stands in for vLLM's
client; no engine runs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

from core import FinishReason, Role
from workers.engine import EngineConfig, WorkerEngine
from workers.protocol import GenerateChunk, GenerateRequest, SamplingOptions

EOS = 2


def _output(tokens: list[int], reason: str | None) -> Any:
    """The fields of a vLLM `RequestOutput` (delta) the worker reads."""
    comp = SimpleNamespace(token_ids=tokens, text="", logprobs=None, finish_reason=reason)
    return SimpleNamespace(outputs=[comp], finished=reason is not None, num_cached_tokens=0, metrics=None)


class _FinishingClient:
    """One decode: a first token, then its end once `release` is set: the stop
    token (`stop`), or, when an abort came first, vLLM's final abort output."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.finished_in_engine = False  # the engine already finished the request: an abort finds nothing
        self.aborted = False
        self.errored = False  # the core is alive

    async def generate(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        yield _output([7], None)
        await self.release.wait()
        yield _output([], "abort") if self.aborted else _output([EOS], "stop")

    async def abort(self, request_ids: Any) -> None:
        if not self.finished_in_engine:
            self.aborted = True
            self.release.set()


def _engine(client: _FinishingClient) -> WorkerEngine:
    eng = WorkerEngine(EngineConfig(model="unused", kv_pool=False), phase_of=lambda: None)
    eng._llm, eng.started = client, True  # type: ignore[assignment]  # the fake client in vLLM's place
    eng.vocab_size, eng.max_model_len = 100, 1000
    return eng


async def _decode_with_migration(client: _FinishingClient) -> tuple[list[GenerateChunk], list[str]]:
    eng = _engine(client)
    req = GenerateRequest(
        request_id="r.2", prompt_token_ids=[1, 5, 6], role=Role.DECODE, sampling=SamplingOptions(max_tokens=8)
    )
    stream = eng.generate(req)
    chunks = [await anext(stream)]
    migrating = asyncio.ensure_future(eng.migrate(["r.2"]))
    await asyncio.sleep(0)  # the migration has flagged the request and called abort
    client.release.set()
    chunks += [c async for c in stream]
    return chunks, await asyncio.wait_for(migrating, 5)


async def test_a_decode_the_engine_finished_keeps_its_stop_when_a_migration_races_it() -> None:
    client = _FinishingClient()
    client.finished_in_engine = True
    chunks, migrated = await _decode_with_migration(client)
    assert [t for c in chunks for t in c.token_ids] == [7, EOS]
    assert chunks[-1].finish_reason is FinishReason.STOP  # not MIGRATED: nothing is left to continue
    assert migrated == []  # the switch is told it migrated nothing


async def test_a_decode_the_migration_aborted_ends_migrated() -> None:
    chunks, migrated = await _decode_with_migration(_FinishingClient())
    assert [t for c in chunks for t in c.token_ids] == [7]
    assert chunks[-1].finish_reason is FinishReason.MIGRATED
    assert migrated == ["r.2"]
