"""Root fixtures: the shared real-vLLM cluster (started once per session)."""

pytest_plugins = ["tests.integration.vllm_cluster"]
