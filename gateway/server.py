"""Serving one gateway process: uvicorn on uvloop and httptools, the process
tuned for the request path. What `evolving-infra gateway` / `up` and
`bench gateway` run.

- uvloop and httptools are named, not left to uvicorn's "auto" (which falls
  back to asyncio and h11 without a word when they are missing: 1.3-1.6x
  the CPU per request here).
- No access log.
- `TOKENIZERS_PARALLELISM=false` unless the environment says otherwise:
  the gateway tokenizes one prompt per call, and the tokenizer's thread
  pool competing with the event loop for the cores made a big prompt stall
  the loop for 0.2-1.6 s here.
- The garbage collector (`tune_gc`): everything alive once the app is
  built (imports, the tokenizer; ~400k objects, most from transformers'
  import of torch) is moved out of the collector's sight (`gc.freeze()`)
  and the young generation collected less often. Full collections over
  that heap paused the loop 136-464 ms under load (p99 at concurrency 32:
  310-445 ms before, 38-44 ms after; docs/benchmarks.md).
"""

from __future__ import annotations

import gc
import os
from typing import Any

# (gen0 allocations, gen1 and gen2 collections) between collections; CPython's default is (700, 10, 10).
GC_THRESHOLDS = (20_000, 20, 50)


def tune_gc() -> int:
    """Freeze what is alive now and raise the thresholds; returns the frozen object count."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    return gc.get_freeze_count()


def serve_app(app: Any, *, host: str, port: int, log_level: str = "info", **uvicorn_options: Any) -> None:
    """Run `app` until interrupted (blocking)."""
    import uvicorn

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    tune_gc()
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level=log_level,
        loop="uvloop",
        http="httptools",
        access_log=False,
        **uvicorn_options,
    )
