"""Local stand-in for the external endpoints production calls (Alertmanager's PagerDuty, dead man's
switch and ticket webhook; Cloudflare's purge API): it keeps every call it receives and serves
them back.

`POST /<receiver>` appends `{"receiver", "received_at", "payload"}` as one JSON line to the store
file; `GET /` returns every stored notification as a JSON list, `GET /<receiver>` those sent to one
receiver; `GET /-/ready` answers 200.

Outages, for fault tests (an endpoint production depends on going down, as Cloudflare's API can):
`PUT /-/outage/<receiver>` with `{"status": 503}` makes every later POST to that receiver answer
that status, in Cloudflare's error shape, and store nothing; `DELETE /-/outage/<receiver>` ends
it; `GET /-/outage` lists the outages in force.

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
OUTAGE = "-/outage"


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


class Outages:
    """Receivers whose calls fail, and the status they fail with."""

    def __init__(self) -> None:
        self._status: dict[str, int] = {}
        self._lock = threading.Lock()

    def set(self, receiver: str, status: int) -> None:
        with self._lock:
            self._status[receiver] = status

    def clear(self, receiver: str) -> bool:
        with self._lock:
            return self._status.pop(receiver, None) is not None

    def of(self, receiver: str) -> int | None:
        with self._lock:
            return self._status.get(receiver)

    def all(self) -> dict[str, int]:
        with self._lock:
            return dict(self._status)


def handler(store: Store, outages: Outages | None = None) -> type[BaseHTTPRequestHandler]:
    down = outages if outages is not None else Outages()

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> Any:
            """The JSON body; answers 400 and raises ValueError when there is none to read."""
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                self._answer(HTTPStatus.BAD_REQUEST, {"error": f"body over {MAX_BODY} bytes"})
                raise ValueError("too large")
            try:
                return json.loads(self.rfile.read(length) or b"null")
            except ValueError:
                self._answer(HTTPStatus.BAD_REQUEST, {"error": "the body is not JSON"})
                raise

        def _outage_of(self) -> str | None:
            """The receiver of a `/-/outage/<receiver>` path; None (400 sent) if it names none."""
            path = self.path.split("?", 1)[0].strip("/")
            receiver = path.removeprefix(OUTAGE).strip("/")
            if not path.startswith(OUTAGE) or not receiver or "/" in receiver:
                self._answer(HTTPStatus.BAD_REQUEST, {"error": f"use /{OUTAGE}/<receiver>"})
                return None
            return receiver

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0].strip("/")
            if path == "-/ready":
                self._answer(HTTPStatus.OK, {"ready": True})
            elif path == OUTAGE:
                self._answer(HTTPStatus.OK, down.all())
            else:
                self._answer(HTTPStatus.OK, store.read(path or None))

        def do_PUT(self) -> None:
            receiver = self._outage_of()
            if receiver is None:
                return
            try:
                body = self._body()
            except ValueError:
                return
            status = body.get("status") if isinstance(body, dict) else None
            if not isinstance(status, int) or not 400 <= status <= 599:
                self._answer(HTTPStatus.BAD_REQUEST, {"error": 'body: {"status": 400..599}'})
                return
            down.set(receiver, status)
            self._answer(HTTPStatus.OK, {"receiver": receiver, "status": status})

        def do_DELETE(self) -> None:
            receiver = self._outage_of()
            if receiver is not None:
                self._answer(HTTPStatus.OK, {"receiver": receiver, "ended": down.clear(receiver)})

        def do_POST(self) -> None:
            # the first segment names the receiver; an API stand-in's call keeps its full path
            # (Cloudflare's purge is POST /cloudflare/zones/<zone>/purge_cache)
            full = self.path.split("?", 1)[0].strip("/")
            receiver, _, rest = full.partition("/")
            if not receiver or receiver == "-":
                self._answer(HTTPStatus.BAD_REQUEST, {"error": "POST /<receiver>, JSON body"})
                return
            try:
                payload = self._body()
            except ValueError:
                return
            failing = down.of(receiver)
            if failing is not None:
                error = {"code": failing, "message": f"{receiver}: outage (local sink)"}
                self._answer(failing, {"success": False, "errors": [error]})
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
