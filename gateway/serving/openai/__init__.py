"""The OpenAI-compatible HTTP surface: schemas, SSE encoding, routes."""
