"""Local stand-in for the external endpoints production calls (Alertmanager's PagerDuty, dead man's
switch and ticket webhook; Cloudflare's purge API): it keeps every call it receives and serves
them back.

`POST /<receiver>` appends `{"receiver", "received_at", "payload"}` as one JSON line to the store
file; `GET /` returns every stored notification as a JSON list, `GET /<receiver>` those sent to one
receiver; `GET /-/ready` answers 200.

    python -m local.webhook_sink --host 127.0.0.1 --port 9095 --store .stack/data/webhook-sink.jsonl
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

MAX_BODY = 1 << 20  # Alertmanager batches; a notification is a few KB


class Store:
    """Append-only JSON lines: what arrived survives a restart of the sink."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)

    def add(self, receiver: str, payload: Any, path: str = "") -> None:
        entry = {"receiver": receiver, "received_at": time.time(), "payload": payload}
        if path:
            entry["path"] = path
        line = json.dumps(entry)
        with self._lock, self.path.open("a") as f:
            f.write(line + "\n")

    def read(self, receiver: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            try:
                lines = self.path.read_text().splitlines()
            except FileNotFoundError:
                return []
        entries = [json.loads(line) for line in lines if line.strip()]
        return [e for e in entries if receiver is None or e["receiver"] == receiver]


def handler(store: Store) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _answer(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0].strip("/")
            if path == "-/ready":
                self._answer(HTTPStatus.OK, {"ready": True})
            else:
                self._answer(HTTPStatus.OK, store.read(path or None))

        def do_POST(self) -> None:
            # the first segment names the receiver; an API stand-in's call keeps its full path
            # (Cloudflare's purge is POST /cloudflare/zones/<zone>/purge_cache)
            full = self.path.split("?", 1)[0].strip("/")
            receiver, _, rest = full.partition("/")
            length = int(self.headers.get("Content-Length") or 0)
            if not receiver or length > MAX_BODY:
                self._answer(HTTPStatus.BAD_REQUEST, {"error": "POST /<receiver>, JSON body"})
                return
            try:
                payload = json.loads(self.rfile.read(length) or b"null")
            except ValueError:
                self._answer(HTTPStatus.BAD_REQUEST, {"error": "the body is not JSON"})
                return
            store.add(receiver, payload, rest)
            # `success` is Cloudflare's answer shape; Alertmanager reads only the status
            self._answer(HTTPStatus.OK, {"stored": True, "success": True})

        def log_message(self, format: str, *args: Any) -> None:
            pass  # one line per Watchdog beat would drown the log

    return Handler


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--store", type=Path, required=True)
    args = parser.parse_args(argv)
    server = ThreadingHTTPServer((args.host, args.port), handler(Store(args.store)))
    server.serve_forever()


if __name__ == "__main__":
    main()
