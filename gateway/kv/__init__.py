"""The KV directory client (block hashes, branches, locations) and its circuit breaker."""
