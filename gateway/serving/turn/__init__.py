"""The generation turn every API shares: spec, vLLM parsing, choices."""
