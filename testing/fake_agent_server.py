"""A fake peer's `GET /internal/kv/agent` on a free loopback port (tests).

Serves whatever `AgentInfo` it holds (404 before one is set, as a worker
whose connector has not registered yet), and, like a worker bound beyond
loopback, answers 401 unless the request carries the cluster token.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from kvpool.agent_info import AgentInfo


class FakeAgentServer:
    def __init__(self, token: str | None = None) -> None:
        self.token = token
        self.info: AgentInfo | None = None
        self.seen_auth: list[str | None] = []  # Authorization header of every request
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                auth = self.headers.get("Authorization")
                server.seen_auth.append(auth)
                if server.token and auth != f"Bearer {server.token}":
                    self._answer(401, {"error": {"type": "authentication_error", "message": "no token"}})
                elif self.path != "/internal/kv/agent" or server.info is None:
                    self._answer(404, {"error": {"type": "not_found", "message": self.path}})
                else:
                    self._answer(200, dataclasses.asdict(server.info))

            def _answer(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-agent-server", daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
