"""Seeded sampling that survives chunked prefill on vLLM's CPU backend.

vLLM runs the sampler for every scheduled request, also for a prefill chunk
that is not the prompt's last one, and throws that token away
(`discard_request_mask`). For a request with a seed (its own
`torch.Generator`) it then rewinds the generator with
`gen.set_offset(gen.get_offset() - 4)`: a CUDA Philox generator counts its
draws in an offset. The CPU generator (Mersenne Twister) has no offset, so
that line raises `RuntimeError: CPU Generator does not use offset` inside
the EngineCore, which exits: one seeded request whose prompt is longer than
the chunked-prefill budget (`max_num_batched_tokens`) killed the engine.
The gateway gives every non-greedy request with a grammar or penalties a
seed (it is resumed by replay, `gateway.serving.segments`), so a long
prompt with `response_format` json_object and temperature > 0 did.

The fix keeps what vLLM meant: a discarded draw consumes nothing of the
request's random stream. `SeededCPUModelRunner` snapshots those
requests' generator states before sampling and restores them after, and
keeps the generators out of the offset rewind. So the first kept token is
drawn from the freshly seeded state however many chunks the prompt took.
That is also what live migration's token-identical replay needs: a replay
whose prompt is partly cached runs fewer chunks than the first run did.

Loaded in the EngineCore through vLLM's `worker_cls` setting
(`SeededCPUWorker`, set by `workers.engine`); the V2 model runner keeps its
own sampling state and is left alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from vllm.v1.worker.cpu_model_runner import CPUModelRunner
from vllm.v1.worker.cpu_worker import CPUWorker

WORKER_CLS = f"{__name__}.SeededCPUWorker"


def discarded_generators(runner: CPUModelRunner) -> dict[int, torch.Generator]:
    """Batch row -> generator of the seeded requests whose token this step throws away."""
    num_reqs = runner.input_batch.num_reqs
    rows = np.nonzero(runner.discard_request_mask.np[:num_reqs])[0]
    gens = runner.input_batch.generators
    return {int(i): gens[int(i)] for i in rows if int(i) in gens}


class SeededCPUModelRunner(CPUModelRunner):
    """CPUModelRunner whose discarded draws leave seeded generators untouched."""

    def _sample(self, logits: torch.Tensor | None, spec_decode_metadata: Any) -> Any:
        saved = {i: g.get_state() for i, g in discarded_generators(self).items()}
        try:
            return super()._sample(logits, spec_decode_metadata)
        finally:
            gens = self.input_batch.generators
            for i, state in saved.items():
                gens[i].set_state(state)

    def _bookkeeping_sync(self, *args: Any, **kwargs: Any) -> Any:
        # The states were restored in `_sample`; hide these generators from
        # the CUDA-only offset rewind (the same dict the sampler reads, so
        # they go back before the next step).
        gens = self.input_batch.generators
        hidden = {i: gens.pop(i) for i in discarded_generators(self)}
        try:
            return super()._bookkeeping_sync(*args, **kwargs)
        finally:
            gens.update(hidden)


class SeededCPUWorker(CPUWorker):
    """vLLM's CPU worker with `SeededCPUModelRunner` as its model runner."""

    def init_device(self) -> None:
        super().init_device()
        # CPUWorker builds its runner inside init_device (no factory to
        # override); the subclass adds methods only, no state, so switching
        # the instance's class is safe. The V2 runner is another class.
        if type(self.model_runner) is CPUModelRunner:
            self.model_runner.__class__ = SeededCPUModelRunner
