"""The Responses API tools a model can be offered, from what clients declare.

Codex CLI's default request declares, beside plain function tools:
- a `namespace` tool (`{"type": "namespace", "name": "multi_agent_v1",
  "tools": [function tools]}`): its functions are offered to the model as
  `<namespace>__<name>`, and a call to one comes back as a `function_call`
  item with its own `name` and the `namespace` (how Codex reads it); a
  `function_call` the client sends back with a `namespace` is read the same
  way, so the conversation keeps the names the model saw;
- a hosted `web_search` tool: this gateway runs no search, so the model is
  not offered it (it cannot call what nothing would execute); the answer
  names it in the `X-Tools-Not-Offered` header, and a `tool_choice` that
  forces it is refused with a 400.
Every other tool type is left for `convert.parse_request` to refuse.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.http.errors import InvalidRequest

SEPARATOR = "__"
# Hosted search tools (their dated variants too): declared by Codex by default.
WEB_SEARCH = ("web_search", "web_search_preview")


def _is_web_search(kind: Any) -> bool:
    return isinstance(kind, str) and any(kind == w or kind.startswith(w + "_20") for w in WEB_SEARCH)


@dataclass(frozen=True)
class ToolSurface:
    """What `offered_tools` changed in one request, to map the answer back."""

    namespaced: dict[str, tuple[str, str]] = field(default_factory=dict)  # offered name -> (namespace, name)
    not_offered: tuple[str, ...] = ()  # hosted tool types declared but not offered

    def restore_item(self, item: Any) -> Any:
        """A `function_call` output item (plain JSON) with its namespace back."""
        if isinstance(item, dict) and item.get("type") == "function_call" and item.get("name") in self.namespaced:
            namespace, name = self.namespaced[item["name"]]
            return {**item, "name": name, "namespace": namespace}
        return item

    def restore(self, data: dict[str, Any]) -> dict[str, Any]:
        """A response object or stream event with namespaced calls restored."""
        if not self.namespaced:
            return data
        if "item" in data:
            data["item"] = self.restore_item(data["item"])
        if isinstance(data.get("output"), list):
            data["output"] = [self.restore_item(i) for i in data["output"]]
        if isinstance(data.get("response"), dict):
            data["response"] = self.restore(data["response"])
        return data


def _namespace_functions(tool: dict[str, Any], i: int, namespaced: dict[str, tuple[str, str]]) -> list[dict[str, Any]]:
    namespace = tool.get("name")
    if not isinstance(namespace, str) or not namespace:
        raise InvalidRequest("a namespace tool needs a name", param=f"tools.{i}.name")
    out = []
    for j, fn in enumerate(tool.get("tools") or []):
        if not isinstance(fn, dict) or fn.get("type") != "function" or not isinstance(fn.get("name"), str):
            raise InvalidRequest("a namespace holds function tools only", param=f"tools.{i}.tools.{j}")
        offered = f"{namespace}{SEPARATOR}{fn['name']}"
        namespaced[offered] = (namespace, fn["name"])
        out.append({**fn, "name": offered})
    return out


def _input_item(item: Any) -> Any:
    if isinstance(item, dict) and item.get("type") == "function_call" and item.get("namespace"):
        rest = {k: v for k, v in item.items() if k != "namespace"}
        return {**rest, "name": f"{item['namespace']}{SEPARATOR}{item.get('name')}"}
    return item


def offered_tools(body: dict[str, Any]) -> tuple[dict[str, Any], ToolSurface]:
    """The body with namespaces flattened and hosted search left out (see the module docstring)."""
    tools = body.get("tools")
    if not isinstance(tools, list):
        return body, ToolSurface()
    namespaced: dict[str, tuple[str, str]] = {}
    not_offered: list[str] = []
    offered: list[Any] = []
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind == "namespace":
            offered += _namespace_functions(tool, i, namespaced)
        elif _is_web_search(kind):
            not_offered.append(str(kind))
        else:
            offered.append(tool)
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and _is_web_search(choice.get("type")):
        raise InvalidRequest("this gateway runs no web search: `tool_choice` cannot force it", param="tool_choice")
    if isinstance(choice, dict) and choice.get("namespace"):
        rest = {k: v for k, v in choice.items() if k != "namespace"}
        choice = {**rest, "name": f"{choice['namespace']}{SEPARATOR}{choice.get('name')}"}
    out = {**body, "tools": offered}
    if "tool_choice" in body:
        out["tool_choice"] = choice
    if isinstance(body.get("input"), list):
        out["input"] = [_input_item(item) for item in body["input"]]
    return out, ToolSurface(namespaced, tuple(not_offered))
