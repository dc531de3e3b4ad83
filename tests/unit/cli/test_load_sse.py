"""The load generator reads Server-Sent Events split at LF only."""

from __future__ import annotations

import httpx

from cli.load import sse_lines


async def test_lines_split_at_lf_only_across_chunk_boundaries() -> None:
    body = [b'data: {"t":"x\xe2\x80', b'\xa8y"}\r\n\ndata: [DONE]\n', b"\ntail"]

    async def chunks():
        for piece in body:
            yield piece

    response = httpx.Response(200, content=chunks())
    lines = [line async for line in sse_lines(response)]
    assert lines == ['data: {"t":"x\u2028y"}', "", "data: [DONE]", "", "tail"]
