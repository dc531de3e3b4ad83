"""The workers upstream: the worker API port, its httpx and raw HTTP/1.1 clients, the wire encoding."""
