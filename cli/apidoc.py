"""docs/api.md from the gateway's OpenAPI schema (so the page cannot drift).

`render_markdown(schema)` is pure; `python -m cli.apidoc [OUT]` builds
the full app (OpenAI API, branch API, admin API, health, metrics) over a
throwaway SQLite store and no workers, and writes the page. A test checks
the committed page equals a fresh render.
"""

from __future__ import annotations

import sys
from typing import Any

HEADER = """# API reference

Generated from the gateway's OpenAPI schema by `python -m cli.apidoc docs/api.md`;
do not edit by hand. The OpenAI-compatible surface (`/v1/...`) takes a tenant
API key (`Authorization: Bearer sk-...`); the Anthropic Messages routes
(`/v1/messages...`) take the same key as `x-api-key` or Bearer; the admin API
(`/admin/...`) takes an admin token with the viewer or operator role. Errors
are OpenAI-shaped (`{"error": {"message", "type", "param", "code"}}`), on the
Anthropic routes Anthropic-shaped (`{"type": "error", "error": {"type",
"message"}}`). Request bodies name their schema in the OpenAPI document
(`GET /openapi.json`, `components.schemas`): the OpenAI and Anthropic bodies
are vLLM's protocol models, less the fields the gateway refuses.

## Branch contract (headers on the `/v1` generation routes)

| header | meaning |
|---|---|
| `X-Branch-ID` | the agent branch this request belongs to; absent: see below |
| `X-Parent-Branch-ID` | the branch this sub-agent was forked from |
| `X-Session-ID` | the agent run that owns the branches |
| `X-Branch-Finished: true` | this is the branch's last request (or `POST /v1/branches/{id}/finish`) |

Without `X-Branch-ID` the branch is the client's own conversation id where it
sends one (`prompt_cache_key`, a `previous_response_id` chain, Claude Code's
session; on `/v1/responses` and `/v1/messages` the conversation's opening),
else the request is a branch of its own. A branch keeps references to its KV
blocks until it finishes or expires after an idle TTL; referenced blocks are
evicted last.
"""

METHODS = ("get", "post", "put", "patch", "delete")


def _ref_name(schema: dict[str, Any] | None) -> str:
    if not schema:
        return ""
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[-1]
    if "anyOf" in schema:
        return " or ".join(filter(None, (_ref_name(s) for s in schema["anyOf"])))
    if schema.get("type") == "array":
        return f"list[{_ref_name(schema.get('items'))}]"
    return schema.get("type", "")


def _section(path: str, method: str, op: dict[str, Any]) -> list[str]:
    lines = [f"### `{method.upper()} {path}`", ""]
    if op.get("summary"):
        lines += [op["summary"], ""]
    if op.get("description"):
        lines += [op["description"].strip(), ""]
    params = op.get("parameters", [])
    if params:
        lines += ["| parameter | in | type | required |", "|---|---|---|---|"]
        lines += [
            f"| `{p['name']}` | {p['in']} | {_ref_name(p.get('schema'))} | {p.get('required', False)} |" for p in params
        ]
        lines.append("")
    body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
    if body:
        lines += [f"Request body: `{_ref_name(body)}`", ""]
    security = op.get("security")
    if security:
        lines += ["Security: " + " or ".join(" + ".join(f"`{name}`" for name in alt) for alt in security), ""]
    codes = sorted(op.get("responses", {}))
    if codes:
        lines += ["Responses: " + ", ".join(f"`{c}`" for c in codes), ""]
    return lines


def render_markdown(schema: dict[str, Any]) -> str:
    groups: dict[str, list[str]] = {}
    for path in sorted(schema.get("paths", {})):
        for method in METHODS:
            op = schema["paths"][path].get(method)
            if op is None:
                continue
            tag = (op.get("tags") or [_default_tag(path)])[0]
            groups.setdefault(tag, []).extend(_section(path, method, op))
    out = [HEADER]
    schemes = schema.get("components", {}).get("securitySchemes", {})
    if schemes:
        out += ["## Security schemes", "", "| name | kind | description |", "|---|---|---|"]
        out += [f"| `{name}` | {_scheme_kind(s)} | {s.get('description', '')} |" for name, s in sorted(schemes.items())]
        out.append("")
    for tag in sorted(groups):
        out += [f"## {tag}", "", *groups[tag]]
    return "\n".join(out).rstrip() + "\n"


def _scheme_kind(scheme: dict[str, Any]) -> str:
    if scheme.get("type") == "http":
        return f"HTTP {scheme.get('scheme', '')}".strip()
    if scheme.get("type") == "apiKey":
        return f"API key in {scheme.get('in')} `{scheme.get('name')}`"
    return str(scheme.get("type", ""))


def _default_tag(path: str) -> str:
    if path.startswith("/v1/branches"):
        return "branches"
    if path.startswith("/v1"):
        return "openai"
    if path.startswith("/admin"):
        return "admin"
    return "operations"


def build_schema() -> dict[str, Any]:
    import tempfile

    from gateway.compose import compose_app
    from gateway.settings import GatewaySettings

    with tempfile.TemporaryDirectory() as tmp:
        from workers.tiny_model import init_tiny  # the tokenizer only; no engine starts

        model = init_tiny(f"{tmp}/model")
        settings = GatewaySettings(model_dir=str(model), model_name="demo-model", db_url=f"sqlite:///{tmp}/api.db")
        return compose_app(settings).openapi()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    text = render_markdown(build_schema())
    if argv:
        with open(argv[0], "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
