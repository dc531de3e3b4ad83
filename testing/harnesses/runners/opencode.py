"""OpenCode (`opencode run`) with an openai-compatible provider at the gateway.

The config (OPENCODE_CONFIG, kept outside the task's folder so the folder
holds only the task's files) names the provider, its base URL and key, and
the model's limits (context and output, which OpenCode cannot learn from a
private provider). Autoupdate, share, the models.dev fetch and LSP downloads
are off: nothing outside may be reached. The second turn is
`opencode run --continue`.
"""

from __future__ import annotations

import json

from testing.harnesses.runners import cli_path
from testing.harnesses.scratch import Scratch, TurnOutcome, run_cli
from testing.harnesses.target import Target


class OpenCode:
    name = "opencode"
    forces_tool = False
    cli = "opencode"  # its entry point in BIN_DIR

    def __init__(self, target: Target, scratch: Scratch) -> None:
        self.target, self.scratch = target, scratch
        self.config = scratch.home / "opencode.json"
        model = {"name": target.model, "limit": {"context": target.context_tokens, "output": target.max_output_tokens}}
        config = {
            "$schema": "https://opencode.ai/config.json",
            "provider": {
                "evolving": {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "Evolving Infra gateway",
                    "options": {"baseURL": target.v1, "apiKey": "{env:EVOLVING_API_KEY}"},
                    "models": {target.model: model},
                }
            },
            "model": f"evolving/{target.model}",
            "autoupdate": False,
            "share": "disabled",
        }
        self.config.write_text(json.dumps(config, indent=2))

    def turn(self, n: int, prompt: str) -> TurnOutcome:
        cmd = [str(cli_path(self.cli)), "run", "--format", "json"]
        if n:
            cmd.append("--continue")
        cmd += ["--", prompt]
        env = self.scratch.env(
            OPENCODE_CONFIG=str(self.config),
            EVOLVING_API_KEY=self.target.api_key,
            OPENCODE_DISABLE_AUTOUPDATE="1",
            OPENCODE_DISABLE_SHARE="1",
            OPENCODE_DISABLE_MODELS_FETCH="1",
            OPENCODE_DISABLE_LSP_DOWNLOAD="1",
        )
        return run_cli(cmd, cwd=self.scratch.workdir, env=env, timeout_s=self.target.timeout_s)
