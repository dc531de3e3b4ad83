"""The API routes' part of the OpenAPI document: request bodies, security
schemes and the branch headers.

The /v1 routes read their bodies themselves (a size limit, OpenAI-shaped
400s instead of FastAPI's 422), so FastAPI cannot see the body models:
`body_of(Model)` names the model in the route's `openapi_extra`, and
`install_openapi(app)` adds every named model's JSON schema to the
document's components, with the security schemes the routes use.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

TENANT_KEY = "TenantKey"
ANTHROPIC_KEY = "AnthropicKey"
SECURITY_SCHEMES: dict[str, dict[str, Any]] = {
    TENANT_KEY: {
        "type": "http",
        "scheme": "bearer",
        "description": "A tenant API key: `Authorization: Bearer sk-...`",
    },
    ANTHROPIC_KEY: {
        "type": "apiKey",
        "in": "header",
        "name": "x-api-key",
        "description": "A tenant API key as Anthropic clients send it (`Authorization: Bearer` works too)",
    },
}
BEARER: dict[str, Any] = {"security": [{TENANT_KEY: []}]}
ANTHROPIC: dict[str, Any] = {"security": [{ANTHROPIC_KEY: []}, {TENANT_KEY: []}]}

_ID_SCHEMA = {"type": "string", "pattern": "^[A-Za-z0-9._:\\-]{1,128}$"}
BRANCH_HEADERS: list[dict[str, Any]] = [
    {"name": "X-Branch-ID", "in": "header", "required": False, "schema": _ID_SCHEMA},
    {"name": "X-Parent-Branch-ID", "in": "header", "required": False, "schema": _ID_SCHEMA},
    {"name": "X-Session-ID", "in": "header", "required": False, "schema": _ID_SCHEMA},
    {
        "name": "X-Branch-Finished",
        "in": "header",
        "required": False,
        "schema": {"type": "string", "enum": ["true", "false"]},
    },
]

# model name -> (model, properties left out of its schema: fields the gateway refuses)
_BODIES: dict[str, tuple[type[BaseModel], frozenset[str]]] = {}


def body_of(
    model: type[BaseModel], *, security: dict[str, Any] = BEARER, exclude: Iterable[str] = ()
) -> dict[str, Any]:
    """`openapi_extra` for a route whose JSON body is `model`."""
    _BODIES[model.__name__] = (model, frozenset(exclude))
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}},
        },
        "parameters": list(BRANCH_HEADERS),
        **security,
    }


def install_openapi(app: FastAPI) -> None:
    """Make `app.openapi()` include the body models and the security schemes."""
    base = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        doc = base()
        components = doc.setdefault("components", {})
        schemas = components.setdefault("schemas", {})
        for name, (model, exclude) in _BODIES.items():
            schema = model.model_json_schema(ref_template="#/components/schemas/{model}", by_alias=True)
            for key, value in schema.pop("$defs", {}).items():
                schemas.setdefault(key, value)
            for field in exclude:
                schema.get("properties", {}).pop(field, None)
            if "required" in schema:
                schema["required"] = [f for f in schema["required"] if f not in exclude]
            schemas[name] = schema
        components.setdefault("securitySchemes", {}).update(SECURITY_SCHEMES)
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to extend its schema
