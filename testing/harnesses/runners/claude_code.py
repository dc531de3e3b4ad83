"""Claude Code (`claude -p`) with ANTHROPIC_BASE_URL at the gateway.

Its default request otherwise: no feature is switched off to make it pass.
What is set is what a user behind a private gateway sets: the key, the
model the gateway serves, telemetry / error reporting / nonessential traffic
off (nothing outside may be reached), its own output-token cap, and the
listing tools allowed (a non-interactive run cannot ask for permission).
The second turn is `claude -p --continue`.
"""

from __future__ import annotations

from testing.harnesses.runners import cli_path
from testing.harnesses.scratch import Scratch, TurnOutcome, run_cli
from testing.harnesses.target import Target

ALLOWED_TOOLS = ["Bash(ls:*)", "Glob", "LS", "Read"]


class ClaudeCode:
    name = "claude-code"
    forces_tool = False
    cli = "claude"  # its entry point in BIN_DIR

    def __init__(self, target: Target, scratch: Scratch) -> None:
        self.target, self.scratch = target, scratch

    def turn(self, n: int, prompt: str) -> TurnOutcome:
        cmd = [str(cli_path(self.cli)), "-p", "--model", self.target.model, "--output-format", "json"]
        if n:
            cmd.append("--continue")
        cmd += ["--allowedTools", *ALLOWED_TOOLS, "--", prompt]
        env = self.scratch.env(
            ANTHROPIC_BASE_URL=self.target.base_url,
            ANTHROPIC_API_KEY=self.target.api_key,
            DISABLE_TELEMETRY="1",
            DISABLE_ERROR_REPORTING="1",
            DISABLE_AUTOUPDATER="1",
            CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
            CLAUDE_CODE_MAX_OUTPUT_TOKENS=str(self.target.max_output_tokens),
        )
        return run_cli(cmd, cwd=self.scratch.workdir, env=env, timeout_s=self.target.timeout_s)
