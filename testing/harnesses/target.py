"""What a harness is pointed at, and the shape every harness runner has."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from testing.harnesses.scratch import TurnOutcome


@dataclass(frozen=True)
class Target:
    base_url: str  # the server root, no /v1 (the recording proxy in the suite)
    api_key: str
    model: str  # the served model's id
    context_tokens: int  # the workers' context, told to harnesses that ask for it in their config
    max_output_tokens: int  # told to harnesses whose own config has such a setting
    timeout_s: float  # per turn

    @property
    def v1(self) -> str:
        return self.base_url + "/v1"


class Harness(Protocol):
    """One agent harness in its default configuration, pointed at `Target`.

    `turn(0, task)` starts a session in `scratch.workdir`; `turn(n, prompt)` for
    n > 0 continues the same session (the CLI's resume / continue, the SDK's
    next turn), so the gateway sees one conversation grow. A turn never raises
    for the harness's own failure: it reports it in the outcome's exit code.
    """

    name: str
    forces_tool: bool  # the task makes it call a tool on its first turn

    def turn(self, n: int, prompt: str) -> TurnOutcome: ...
