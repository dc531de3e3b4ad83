"""LangGraph's prebuilt ReAct agent over langchain-openai's ChatOpenAI (Chat
Completions) with one tool and a checkpointer, so the next turn continues
the same thread. Until the thread's first tool result the model is bound
with tool_choice "any" (a tool round trip happens); after it, "auto".
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from testing.harnesses.runners._tools import DESCRIPTION, INSTRUCTIONS, list_files
from testing.harnesses.scratch import Scratch, TurnOutcome
from testing.harnesses.target import Target

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig


class LangGraph:
    name = "langgraph"
    forces_tool = True

    def __init__(self, target: Target, scratch: Scratch) -> None:
        from langchain_core.messages import ToolMessage
        from langchain_core.tools import StructuredTool
        from langchain_openai import ChatOpenAI
        from langgraph.checkpoint.memory import InMemorySaver
        from langgraph.prebuilt import create_react_agent
        from pydantic import SecretStr

        self.target, self.scratch = target, scratch
        self.calls = 0

        def run_tool() -> str:
            self.calls += 1
            return list_files(scratch.workdir)

        tool = StructuredTool.from_function(run_tool, name="list_files", description=DESCRIPTION)
        llm = ChatOpenAI(
            model=target.model,
            base_url=target.v1,
            api_key=SecretStr(target.api_key),
            max_retries=0,
            timeout=target.timeout_s,
        )
        forced = llm.bind_tools([tool], tool_choice="any", parallel_tool_calls=False)
        free = llm.bind_tools([tool])

        def pick(state: Any, runtime: Any) -> Any:
            return free if any(isinstance(m, ToolMessage) for m in state["messages"]) else forced

        self.agent = create_react_agent(pick, [tool], prompt=INSTRUCTIONS, checkpointer=InMemorySaver())
        self.config: RunnableConfig = {"configurable": {"thread_id": "harness"}, "recursion_limit": 10}

    def turn(self, n: int, prompt: str) -> TurnOutcome:
        start = time.monotonic()
        before = self.calls
        try:
            state = self.agent.invoke({"messages": [("user", prompt)]}, self.config)
        except Exception as exc:  # noqa: BLE001 - the harness's failure is this turn's outcome
            return TurnOutcome(1, "", f"{type(exc).__name__}: {exc}", self.calls - before, time.monotonic() - start)
        return TurnOutcome(0, str(state["messages"][-1].content), "", self.calls - before, time.monotonic() - start)
