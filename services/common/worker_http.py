"""A small HTTP server for Kafka workers: /healthz, /readyz and /metrics, on its own thread."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from services.contracts import workloads


def serve(host: str, port: int, ready: Callable[[], dict[str, bool]]) -> ThreadingHTTPServer:
    """Start serving in a daemon thread; `ready()` returns named checks for /readyz."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == workloads.HEALTH_PATH:
                self._send(200, "application/json", b'{"status":"ok"}')
            elif self.path == workloads.READY_PATH:
                checks = ready()
                ok = all(checks.values())
                body = json.dumps({"ready": ok, "checks": checks}).encode()
                self._send(200 if ok else 503, "application/json", body)
            elif self.path == workloads.METRICS_PATH:
                self._send(200, CONTENT_TYPE_LATEST, generate_latest())
            else:
                self._send(404, "application/json", b'{"error":{"code":"not_found"}}')

        def _send(self, status: int, ctype: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # scrapes every 5 s would drown the worker's own log

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="ops-http", daemon=True).start()
    return server
