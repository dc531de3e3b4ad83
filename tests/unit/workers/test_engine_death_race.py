"""A core that dies under a request is reported `engine_died`, even when the
request learns of it before vLLM's client counts itself errored (issue 31:
a poison request's first deaths were not counted, so it reached a third
engine). A fake AsyncLLM stands in for vLLM's client; no engine runs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from core import Role
from workers.engine import EngineConfig, EngineError, WorkerEngine
from workers.protocol import ENGINE_DIED, GenerateRequest, SamplingOptions


class _DyingClient:
    """vLLM's client as the request sees a core die: its stream ends (or
    raises `error`) first; `errored` turns true `lag_s` later."""

    def __init__(self, error: BaseException | None, lag_s: float) -> None:
        self.error, self.lag_s, self.errored = error, lag_s, False
        self.aborted: list[Any] = []
        self.before_end: asyncio.Event | None = None  # set: the stream ends once this is set

    async def generate(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        if self.before_end is not None:
            await self.before_end.wait()
        asyncio.get_running_loop().call_later(self.lag_s, setattr, self, "errored", True)
        if self.error is not None:
            raise self.error
        outputs: tuple[Any, ...] = ()  # the stream ends at once, unfinished
        for out in outputs:
            yield out

    async def abort(self, request_id: Any) -> None:
        self.aborted.append(request_id)


def _engine(client: _DyingClient) -> WorkerEngine:
    eng = WorkerEngine(EngineConfig(model="unused", kv_pool=False), phase_of=lambda: None)
    eng._llm, eng.started = client, True  # type: ignore[assignment]  # the fake client in vLLM's place
    eng.vocab_size, eng.max_model_len = 100, 1000
    return eng


def _request() -> GenerateRequest:
    return GenerateRequest(
        request_id="poison.1", prompt_token_ids=[1, 2, 3], role=Role.PREFILL, sampling=SamplingOptions(max_tokens=1)
    )


async def _run(eng: WorkerEngine) -> EngineError:
    with pytest.raises(EngineError) as err:
        async for _ in eng.generate(_request()):
            pass
    return err.value


async def test_a_stream_that_ends_before_the_client_knows_its_core_died_is_engine_died():
    err = await _run(_engine(_DyingClient(None, lag_s=0.2)))
    assert err.kind == ENGINE_DIED


async def test_an_engine_dead_error_is_engine_died_at_once():
    from vllm.v1.engine.exceptions import EngineDeadError

    err = await _run(_engine(_DyingClient(EngineDeadError(), lag_s=5.0)))
    assert err.kind == ENGINE_DIED


async def test_another_error_with_the_core_alive_stays_what_it_was():
    eng = _engine(_DyingClient(RuntimeError("boom"), lag_s=60.0))
    with pytest.raises(RuntimeError, match="boom"):
        async for _ in eng.generate(_request()):
            pass


async def test_a_request_being_migrated_whose_core_dies_is_engine_died():
    """A switch asked the decode to migrate; its core died before the abort
    finished it: the stream ends unfinished, which no migration does."""
    client = _DyingClient(None, lag_s=0.2)
    eng = _engine(client)
    req = _request().model_copy(update={"role": Role.DECODE})
    ends = asyncio.Event()
    client.before_end = ends
    run = asyncio.ensure_future(_run_request(eng, req))
    while req.request_id not in eng.inflight:
        await asyncio.sleep(0.001)
    eng.inflight[req.request_id].migrate = True  # what `WorkerEngine.migrate` sets before its abort
    ends.set()
    err = await run
    assert err.kind == ENGINE_DIED


async def _run_request(eng: WorkerEngine, req: GenerateRequest) -> EngineError:
    with pytest.raises(EngineError) as err:
        async for _ in eng.generate(req):
            pass
    return err.value
