"""A small HTTP server for Kafka workers: /healthz, /readyz and /metrics, on its own thread; and
LoopHealth, what a worker's /readyz says about its own loop."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from services.contracts import workloads


def serve(
    host: str,
    port: int,
    ready: Callable[[], dict[str, bool]],
    alive: Callable[[], bool] = lambda: True,
) -> ThreadingHTTPServer:
    """Start serving in a daemon thread; `ready()` returns named checks for /readyz, `alive()`
    answers /healthz (the kubelet restarts a worker whose loop hung: review D10)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == workloads.HEALTH_PATH:
                if alive():
                    self._send(200, "application/json", b'{"status":"ok"}')
                else:
                    self._send(503, "application/json", b'{"status":"hung"}')
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


def stop_event() -> threading.Event:
    """An event SIGTERM (the kubelet stopping the pod) or SIGINT sets: a worker's loop runs
    until it is set."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    return stop


class LoopHealth:
    """Whether a worker's loop is making progress, as /readyz checks.

    A loop retrying a dependency is alive but stuck: it says so at once, naming the dependency,
    and is ready again as soon as the retry succeeds. Freshness alone ("turned in the last 30 s")
    would read a loop blocked in a retry as ready until the bound passes, then flip to not ready
    with nothing having changed: one probe says ready, the next one, a moment later, not.
    The freshness bound stays, for a loop that stopped without retrying anything (a hung call).

    `alive()` (the liveness probe) is false only for a loop that has not turned for
    `hung_after_s`, counting from its start: a hung call, a deadlock. A loop retrying an outage
    turns at every attempt and stays alive: restarting it would not bring the dependency back.
    """

    def __init__(
        self,
        dependencies: Iterable[str],
        stale_after_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        hung_after_s: float = 120.0,
    ) -> None:
        self.dependencies = tuple(dependencies)
        self._stale_after_s = stale_after_s
        self._hung_after_s = hung_after_s
        self._clock = clock
        self._started = clock()
        self._turned: float | None = None
        self.waiting_for: str | None = None

    def turned(self) -> None:
        """The loop went round once."""
        self._turned = self._clock()

    def failed(self, dependency: str) -> None:
        """A retry on `dependency` failed and will be tried again: the loop still turns."""
        if dependency not in self.dependencies:
            raise ValueError(f"{dependency!r} is not one of {self.dependencies}")
        self.waiting_for = dependency
        self.turned()

    @contextmanager
    def retrying(self, dependency: str) -> Iterator[None]:
        """Around a retry loop on `dependency`: however it ends, the loop no longer waits on it."""
        try:
            yield
        finally:
            if self.waiting_for == dependency:
                self.waiting_for = None

    def alive(self) -> bool:
        last = self._turned if self._turned is not None else self._started
        return self._clock() - last < self._hung_after_s

    def checks(self) -> dict[str, bool]:
        turned = self._turned
        fresh = turned is not None and self._clock() - turned < self._stale_after_s
        return {"poll-loop": fresh, **{d: d != self.waiting_for for d in self.dependencies}}
