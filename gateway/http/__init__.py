"""HTTP plumbing of the gateway: the ASGI app, errors and their answers, body and
auth-header reading, SSE responses, the server process."""
