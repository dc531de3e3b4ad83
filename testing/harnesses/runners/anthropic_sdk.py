"""The Anthropic SDK in a tool loop: a forced `tool_use` (tool_choice any),
its `tool_result`, the answer (streamed), and `count_tokens` of the
conversation; the next turn adds a user message to the same conversation.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from testing.harnesses.runners._tools import DESCRIPTION, INSTRUCTIONS, list_files
from testing.harnesses.scratch import Scratch, TurnOutcome
from testing.harnesses.target import Target

if TYPE_CHECKING:
    from anthropic.types import MessageParam, ToolChoiceParam, ToolParam, ToolResultBlockParam

TOOL: ToolParam = {
    "name": "list_files",
    "description": DESCRIPTION,
    "input_schema": {"type": "object", "properties": {}, "additionalProperties": False},
}
MAX_TOOL_ROUNDS = 3


class AnthropicSDK:
    name = "anthropic"
    forces_tool = True

    def __init__(self, target: Target, scratch: Scratch) -> None:
        import anthropic

        self.target, self.scratch = target, scratch
        self.client = anthropic.Anthropic(
            base_url=target.base_url, api_key=target.api_key, max_retries=0, timeout=target.timeout_s
        )
        self.messages: list[MessageParam] = []

    def turn(self, n: int, prompt: str) -> TurnOutcome:
        start = time.monotonic()
        calls = 0
        self.messages.append({"role": "user", "content": prompt})
        try:
            choice: ToolChoiceParam = {"type": "any"} if n == 0 else {"type": "auto"}
            for _ in range(MAX_TOOL_ROUNDS + 1):
                with self.client.messages.stream(
                    model=self.target.model,
                    max_tokens=self.target.max_output_tokens,
                    system=INSTRUCTIONS,
                    tools=[TOOL],
                    tool_choice=choice,
                    messages=self.messages,
                ) as stream:
                    message = stream.get_final_message()
                self.messages.append({"role": "assistant", "content": message.content})  # as the SDK's docs do
                uses = [b for b in message.content if b.type == "tool_use"]
                if message.stop_reason != "tool_use" or not uses:
                    break
                calls += len(uses)
                results: list[ToolResultBlockParam] = [
                    {"type": "tool_result", "tool_use_id": u.id, "content": list_files(self.scratch.workdir)}
                    for u in uses
                ]
                self.messages.append({"role": "user", "content": results})
                choice = {"type": "auto"}
            counted = self.client.messages.count_tokens(
                model=self.target.model, system=INSTRUCTIONS, tools=[TOOL], messages=self.messages
            )
        except Exception as exc:  # noqa: BLE001 - the harness's failure is this turn's outcome
            return TurnOutcome(1, "", f"{type(exc).__name__}: {exc}", calls, time.monotonic() - start)
        text = "".join(b.text for b in message.content if b.type == "text")
        out = f"{text}\n(count_tokens: {counted.input_tokens}, stop: {message.stop_reason})"
        return TurnOutcome(0, out, "", calls, time.monotonic() - start)
