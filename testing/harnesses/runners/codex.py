"""Codex CLI (`codex exec`, Responses wire API) with a model provider at the gateway.

Its own config (CODEX_HOME/config.toml in the scratch HOME): the provider's
base URL and key variable, approvals never, the workspace sandbox, analytics
and telemetry off, and the model's context window (Codex knows none for a
model outside its catalogue). The second turn is `codex exec resume --last`.
"""

from __future__ import annotations

import json

from testing.harnesses.runners import cli_path
from testing.harnesses.scratch import Scratch, TurnOutcome, run_cli
from testing.harnesses.target import Target

CONFIG = """\
model = "{model}"
model_provider = "evolving"
approval_policy = "never"
sandbox_mode = "workspace-write"
model_context_window = {context}
check_for_update_on_startup = false

[model_providers.evolving]
name = "Evolving Infra gateway"
base_url = "{v1}"
env_key = "EVOLVING_API_KEY"
wire_api = "responses"

[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"
"""


class Codex:
    name = "codex"
    forces_tool = False
    cli = "codex"  # its entry point in BIN_DIR

    def __init__(self, target: Target, scratch: Scratch) -> None:
        self.target, self.scratch = target, scratch
        self.codex_home = scratch.home / ".codex"
        self.codex_home.mkdir(parents=True, exist_ok=True)
        text = CONFIG.format(model=target.model, context=target.context_tokens, v1=json.dumps(target.v1)[1:-1])
        (self.codex_home / "config.toml").write_text(text)

    def turn(self, n: int, prompt: str) -> TurnOutcome:
        head = [str(cli_path(self.cli)), "exec"]
        if n:
            head += ["resume", "--last"]
        cmd = [*head, "--skip-git-repo-check", "--json", prompt]
        env = self.scratch.env(CODEX_HOME=str(self.codex_home), EVOLVING_API_KEY=self.target.api_key)
        return run_cli(cmd, cwd=self.scratch.workdir, env=env, timeout_s=self.target.timeout_s)
