"""HTTP face of `testing.fake_worker.FakeWorker`, plus an OpenAI upstream.

`create_fake_worker_app(worker)` serves the worker protocol (NDJSON
streams) over a FakeWorker. With `openai_model` set, the same app also
answers `POST /v1/chat/completions` (SSE) with `max_tokens` chunks at the
same cadence — the "direct" and LiteLLM upstream of `bench gateway`, so all
paths measured there share one upstream implementation. `GET
/testing/switches` lists the phase changes it carried out with their terms
(what the fencing tests check); `POST /testing/kill_engine` kills its engine
only (the process lives, /healthz answers 503 engine_dead).

As a process (tests and `bench replicas`):

    python -m testing.fake_worker_app --port P --node-id w0 --phase decode \
        [--token-delay-s 0.005] [--switch-delay-s 0] [--block-size 16] [--vocab 1000]
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from gateway.upstream.port import WorkerRejected, WorkerUnreachable
from testing.fake_worker import FakeWorker
from workers.protocol import (
    ErrorBody,
    ErrorResponse,
    FenceRequest,
    GenerateRequest,
    MigrateRequest,
    PhaseChangeRequest,
)


def _error(exc: WorkerRejected) -> JSONResponse:
    body = ErrorResponse(
        error=ErrorBody(type=exc.error_type or "rejected", message=exc.message, retryable=exc.retryable)
    )
    return JSONResponse(body.model_dump(), status_code=exc.status_code)


def create_fake_worker_app(worker: FakeWorker, *, openai_model: str | None = None) -> FastAPI:  # noqa: C901 - a route table
    app = FastAPI()

    @app.post("/internal/generate")
    async def generate(request: Request) -> Response:
        req = GenerateRequest.model_validate_json(await request.body())
        if not req.stream:
            try:
                return Response((await worker.generate(req)).model_dump_json(), media_type="application/json")
            except WorkerRejected as exc:
                return _error(exc)
        stream = worker.generate_stream(req)
        try:
            first = await stream.__anext__()
        except WorkerRejected as exc:
            return _error(exc)

        async def body() -> AsyncIterator[bytes]:
            yield first.model_dump_json().encode() + b"\n"
            async for chunk in stream:
                yield chunk.model_dump_json().encode() + b"\n"

        return StreamingResponse(body(), media_type="application/x-ndjson")

    @app.post("/internal/abort")
    async def abort(request: Request) -> Response:
        rid = json.loads(await request.body())["request_id"]
        return Response(worker.abort(rid).model_dump_json(), media_type="application/json")

    @app.post("/internal/migrate")
    async def migrate(request: Request) -> Response:
        req = MigrateRequest.model_validate_json(await request.body())
        try:
            return Response(worker.migrate(req).model_dump_json(), media_type="application/json")
        except WorkerRejected as exc:
            return _error(exc)

    @app.post("/internal/fence")
    async def fence(request: Request) -> Response:
        req = FenceRequest.model_validate_json(await request.body())
        return Response(worker.fence_status(req.term).model_dump_json(), media_type="application/json")

    @app.get("/internal/phase")
    async def phase() -> Response:
        return Response(worker.phase_status().model_dump_json(), media_type="application/json")

    @app.post("/internal/phase")
    async def change_phase(request: Request) -> Response:
        req = PhaseChangeRequest.model_validate_json(await request.body())
        try:
            return Response((await worker.change_phase(req)).model_dump_json(), media_type="application/json")
        except WorkerRejected as exc:
            return _error(exc)

    @app.get("/internal/stats")
    async def stats(since: int = 0) -> Response:
        try:
            return Response(worker.stats(since).model_dump_json(), media_type="application/json")
        except WorkerUnreachable:
            return JSONResponse({"error": {"type": "dead", "message": "dead", "retryable": True}}, 503)

    @app.get("/testing/switches")
    async def switches() -> list[dict[str, object]]:
        return [{"term": term, "from": frm.value, "to": to.value, "t": t} for term, frm, to, t in worker.switches]

    @app.post("/testing/kill_engine")
    async def kill_engine() -> dict[str, str]:
        worker.kill_engine()
        return {"engine": "dead"}

    @app.get("/healthz", response_model=None)
    async def healthz() -> dict[str, str] | JSONResponse:
        if worker.engine_dead:  # as the real worker: the liveness probe fails
            return JSONResponse({"error": {"type": "engine_dead", "message": "engine dead", "retryable": True}}, 503)
        return {"status": "ok", "engine": "alive"}

    @app.get("/readyz")
    async def readyz() -> dict[str, str]:
        return {"status": "ready"}

    if openai_model is not None:
        _add_openai_upstream(app, worker, openai_model)
    return app


def _add_openai_upstream(app: FastAPI, worker: FakeWorker, model: str) -> None:
    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = json.loads(await request.body())
        n = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        rid, created = f"chatcmpl-up{time.monotonic_ns()}", int(time.time())
        head = json.dumps({"id": rid, "object": "chat.completion.chunk", "created": created, "model": model})[:-1]

        async def stream() -> AsyncIterator[bytes]:
            yield (
                f'data: {head},"choices":[{{"index":0,"delta":{{"role":"assistant","content":""}},'
                f'"finish_reason":null}}]}}\n\n'.encode()
            )
            for i in range(n):
                await asyncio.sleep(worker.token_delay_s)
                reason = '"length"' if i == n - 1 else "null"
                yield (
                    f'data: {head},"choices":[{{"index":0,"delta":{{"content":" tok"}},'
                    f'"finish_reason":{reason}}}]}}\n\n'.encode()
                )
            yield b"data: [DONE]\n\n"

        if body.get("stream"):
            return StreamingResponse(stream(), media_type="text/event-stream")
        return JSONResponse(
            {
                "id": rid,
                "object": "chat.completion",
                "created": created,
                "model": model,
                "choices": [
                    {"index": 0, "finish_reason": "length", "message": {"role": "assistant", "content": " tok" * n}}
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1},
            }
        )


def main(argv: list[str] | None = None) -> None:
    import argparse

    import uvicorn

    from core import Phase

    p = argparse.ArgumentParser(prog="python -m testing.fake_worker_app")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--node-id", required=True)
    p.add_argument("--phase", choices=["prefill", "decode"], default="decode")
    p.add_argument("--token-delay-s", type=float, default=0.005)
    p.add_argument("--switch-delay-s", type=float, default=0.0)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--vocab", type=int, default=1000, help="token ids are drawn from [10, vocab)")
    args = p.parse_args(argv)
    worker = FakeWorker(
        args.node_id,
        phase=Phase(args.phase),
        token_delay_s=args.token_delay_s,
        switch_delay_s=args.switch_delay_s,
        block_size=args.block_size,
        token_range=(10, args.vocab),
    )
    uvicorn.run(create_fake_worker_app(worker), host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
