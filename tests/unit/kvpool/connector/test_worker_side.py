"""When `WorkerSide` copies a finished request's blocks to the host store.

On the CPU backend vLLM's "after the forward launch" is after the whole
(synchronous) forward pass, so saves and load submissions run before it;
on a GPU they stay after the launch, overlapping the forward.
"""

from __future__ import annotations

import torch

from kvpool.connector.worker_side import WorkerSide
from kvpool.plan import SaveItem, StepPlan

BLOCKS, BLOCK_BYTES = 8, 64


def _side(tmp_path) -> tuple[WorkerSide, torch.Tensor]:
    side = WorkerSide("n0", BLOCK_BYTES, capacity=4, extra={"nixl": False, "run_dir": str(tmp_path)})
    kv = torch.arange(BLOCKS * BLOCK_BYTES, dtype=torch.int32).to(torch.uint8).reshape(BLOCKS, BLOCK_BYTES)
    side.register({"layer0": kv})
    return side, kv


def _plan() -> StepPlan:
    return StepPlan(
        saves=[SaveItem("r1", device_blocks=(3, 5), slots=(0, 1), hashes=("ab" * 16, "cd" * 16))],
        shape={"uncached_prompt_tokens": 0, "generated_tokens": 1},
    )


def test_cpu_caches_save_before_the_forward_pass(tmp_path) -> None:
    side, kv = _side(tmp_path)
    assert side.before_forward
    plan = _plan()
    side.begin_step(plan)  # bound right before the forward pass
    assert torch.equal(side.store.data[0], kv[3]) and torch.equal(side.store.data[1], kv[5])
    side.start_step(plan)  # after the forward: nothing left to do, nothing done twice
    assert side.finished(set()) == ({"r1"}, None)
    side.close()


def test_without_the_cpu_rule_the_save_waits_for_the_forward_pass(tmp_path) -> None:
    side, kv = _side(tmp_path)
    side.before_forward = False  # as with GPU caches
    plan = _plan()
    side.begin_step(plan)
    assert side.finished(set()) == (None, None)
    side.start_step(plan)
    assert torch.equal(side.store.data[1], kv[5])
    assert side.finished(set()) == ({"r1"}, None)
    side.close()
