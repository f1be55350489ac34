"""``/health`` on a listener of its own (``--health-port``): answered by a thread of its own, so that it still
answers while the API's event loop is stalled (docs/service.md, "Operations").

Only ``GET /health`` (and ``HEAD``) is served, with the body of the API's
``/health`` (HTTP 503 once the engine thread has died); anything else is a
404. Each connection has its own thread and :data:`TIMEOUT` seconds to send its
request; with TLS configured the listener speaks TLS too (the handshake in the
connection's thread).
"""

from __future__ import annotations

import json
import logging
import socket
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from yfpp.errors import YfppError

log = logging.getLogger("yfpp.service")

TIMEOUT = 5.0  #: seconds a health connection has to send its request


class HealthListener(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, host: str, port: int, health: Callable[[], dict[str, Any]], tls: ssl.SSLContext | None):
        self.health, self.tls = health, tls
        try:
            super().__init__((host, port), _Handler)
        except OSError as e:
            raise YfppError(f"cannot listen for health on {host}:{port}: {e.strerror or e}") from e
        self.thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.2},
                                       name=f"health :{self.port}", daemon=True)

    @property
    def port(self) -> int:
        return self.server_address[1]

    def get_request(self) -> tuple[socket.socket, Any]:
        conn, addr = super().get_request()
        if self.tls is not None:  # (the handshake comes with the first read, in the connection's thread)
            conn = self.tls.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
        return conn, addr

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.shutdown()
        self.server_close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that failed (a bad handshake, a reset): logged, never a traceback."""
        log.debug("health connection failed", extra={"peer": str(client_address)[:100]}, exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    server: HealthListener
    timeout = TIMEOUT

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _answer(self, body: bool) -> None:
        if self.path.split("?", 1)[0] != "/health":
            data, status = b'{"detail": "only /health is served here"}', 404
        else:
            health = self.server.health()
            data, status = json.dumps(health).encode(), 503 if health["status"] == "failed" else 200
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        """(no access log, as for the API)"""
