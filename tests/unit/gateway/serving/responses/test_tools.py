"""Codex's tools: a namespace flattened and restored, hosted search not offered."""

from __future__ import annotations

import pytest

from gateway.http.errors import InvalidRequest
from gateway.serving.responses.convert import parse_request
from gateway.serving.responses.tools import offered_tools

FN = {"type": "function", "name": "exec_command", "parameters": {"type": "object"}, "strict": False}
NAMESPACE = {
    "type": "namespace",
    "name": "multi_agent_v1",
    "description": "Sub-agents.",
    "tools": [{"type": "function", "name": "spawn_agent", "parameters": {"type": "object"}, "strict": False}],
}
CODEX = {
    "model": "m",
    "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {
            "type": "function_call",
            "call_id": "c1",
            "name": "spawn_agent",
            "namespace": "multi_agent_v1",
            "arguments": "{}",
        },
        {"type": "function_call_output", "call_id": "c1", "output": "agent-7"},
    ],
    "tools": [FN, NAMESPACE, {"type": "web_search", "external_web_access": False}],
    "tool_choice": "auto",
    "client_metadata": {"x-codex-window-id": "w:0"},
}


def test_codex_default_tools_become_function_tools_vllm_accepts() -> None:
    body, surface = offered_tools(CODEX)
    assert [t["name"] for t in body["tools"]] == ["exec_command", "multi_agent_v1__spawn_agent"]
    assert surface.not_offered == ("web_search",)
    assert body["input"][1]["name"] == "multi_agent_v1__spawn_agent" and "namespace" not in body["input"][1]
    req = parse_request(body)  # client_metadata accepted, every tool a function tool
    assert len(req.tools) == 2


def test_a_namespaced_call_comes_back_with_its_namespace() -> None:
    _, surface = offered_tools(CODEX)
    item = {"type": "function_call", "name": "multi_agent_v1__spawn_agent", "call_id": "c2", "arguments": "{}"}
    assert surface.restore({"type": "response.output_item.done", "item": item})["item"] == {
        **item,
        "name": "spawn_agent",
        "namespace": "multi_agent_v1",
    }
    response = surface.restore({"output": [item, {"type": "message"}]})
    assert response["output"][0]["namespace"] == "multi_agent_v1" and response["output"][1] == {"type": "message"}
    plain = {"type": "function_call", "name": "exec_command"}
    assert surface.restore_item(plain) is plain


@pytest.mark.parametrize(
    ("tools", "choice", "param"),
    [
        ([{"type": "web_search"}], {"type": "web_search"}, "tool_choice"),
        ([{"type": "namespace", "tools": []}], "auto", "tools.0.name"),
        ([{"type": "namespace", "name": "n", "tools": [{"type": "web_search"}]}], "auto", "tools.0.tools.0"),
    ],
)
def test_what_cannot_be_offered_is_refused(tools: list, choice: object, param: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        offered_tools({"model": "m", "input": "hi", "tools": tools, "tool_choice": choice})
    assert err.value.param == param
