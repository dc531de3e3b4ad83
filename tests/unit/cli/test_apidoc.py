"""docs/api.md is generated from the live OpenAPI schema; it must not drift."""

import pathlib

from cli.apidoc import build_schema, render_markdown

DOC = pathlib.Path(__file__).resolve().parents[3] / "docs" / "api.md"


def test_render_lists_operations_with_params_and_bodies():
    schema = {
        "paths": {
            "/v1/models": {"get": {"summary": "List models", "responses": {"200": {}}}},
            "/admin/pins/split": {
                "put": {
                    "tags": ["admin"],
                    "requestBody": {
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/SplitPin"}}}
                    },
                    "responses": {"200": {}, "403": {}},
                }
            },
            "/v1/messages": {"post": {"security": [{"AnthropicKey": []}, {"TenantKey": []}], "responses": {}}},
        },
        "components": {
            "securitySchemes": {
                "TenantKey": {"type": "http", "scheme": "bearer", "description": "a key"},
                "AnthropicKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
            }
        },
    }
    text = render_markdown(schema)
    assert "### `GET /v1/models`" in text and "List models" in text
    assert "Request body: `SplitPin`" in text and "Responses: `200`, `403`" in text
    assert "Security: `AnthropicKey` or `TenantKey`" in text
    assert "| `TenantKey` | HTTP bearer | a key |" in text and "API key in header `x-api-key`" in text


def test_committed_api_doc_matches_the_schema():
    assert DOC.read_text(encoding="utf-8") == render_markdown(build_schema()), (
        "docs/api.md is stale: run `python -m cli.apidoc docs/api.md`"
    )
