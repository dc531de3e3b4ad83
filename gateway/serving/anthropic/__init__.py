"""The Anthropic Messages API (/v1/messages)."""
