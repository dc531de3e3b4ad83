"""The OpenAI Agents SDK on its default model (Responses API) with a strict
function tool. The first turn requires a tool (`tool_choice="required"`; the
agent resets it to auto once the tool ran, so the model then answers); the
next turn continues the first over `previous_response_id`.
"""

from __future__ import annotations

import asyncio
import time

from testing.harnesses.runners._tools import DESCRIPTION, INSTRUCTIONS, list_files
from testing.harnesses.scratch import Scratch, TurnOutcome
from testing.harnesses.target import Target


class AgentsSDK:
    name = "openai-agents"
    forces_tool = True

    def __init__(self, target: Target, scratch: Scratch) -> None:
        self.target, self.scratch = target, scratch
        self.previous_response_id: str | None = None

    def turn(self, n: int, prompt: str) -> TurnOutcome:
        start = time.monotonic()
        calls: list[str] = []
        continues = n == 0 or self.previous_response_id is not None
        try:
            output = asyncio.run(self._run(n, prompt, calls))
        except Exception as exc:  # noqa: BLE001 - the harness's failure is this turn's outcome
            self.previous_response_id = None  # the SDK returned no response to chain from
            return TurnOutcome(
                1, "", f"{type(exc).__name__}: {exc}", len(calls), time.monotonic() - start, continues_session=continues
            )
        return TurnOutcome(0, output, "", len(calls), time.monotonic() - start, continues_session=continues)

    async def _run(self, n: int, prompt: str, calls: list[str]) -> str:
        from agents import Agent, ModelSettings, Runner, function_tool, set_default_openai_client, set_tracing_disabled
        from openai import AsyncOpenAI

        # A client per turn: its pooled connections belong to this turn's event loop.
        client = AsyncOpenAI(
            base_url=self.target.v1, api_key=self.target.api_key, max_retries=0, timeout=self.target.timeout_s
        )
        set_tracing_disabled(True)
        set_default_openai_client(client, use_for_tracing=False)
        folder = self.scratch.workdir

        @function_tool(description_override=DESCRIPTION)  # strict JSON schema: the SDK's default
        def list_folder_files() -> str:
            calls.append("list_files")
            return list_files(folder)

        list_folder_files.name = "list_files"
        # No max_tokens: the SDK sets none by default, so the gateway's default (what the context
        # leaves, bounded by the operator) applies. A cap would end a long answer as `incomplete`,
        # which the SDK raises on.
        settings = ModelSettings(tool_choice="required" if n == 0 else None)
        agent = Agent(name="files", instructions=INSTRUCTIONS, tools=[list_folder_files], model_settings=settings)
        try:
            result = await Runner.run(agent, prompt, previous_response_id=self.previous_response_id, max_turns=4)
        finally:
            await client.close()
        self.previous_response_id = result.last_response_id
        return str(result.final_output)
