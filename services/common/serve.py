"""Run an HTTP service: its API on one port (mTLS from the gateway when a certificate folder is
given) and its probes and metrics on the ops port, plain HTTP, from one process and one app.

    python -m services.common.serve services.read.main --host 0.0.0.0 --port 8080 \\
        --ops-port 9100 --tls-dir /etc/likes/tls

Why two servers: the kubelet's probes and Prometheus's scrapes carry no client certificate, and
the API must not be reachable without one. The ops server serves the same app (the same
/readyz checks and the same registry) but only the ops paths, and it runs no lifespan: the API
server's lifespan opens the stores once. Until that lifespan has finished /readyz answers 503.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import logging
import os
import ssl
import sys
from collections.abc import Callable, Iterator

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send

from services.contracts import tls, workloads

log = logging.getLogger("serve")

OPS_PATHS = frozenset({workloads.HEALTH_PATH, workloads.READY_PATH, workloads.METRICS_PATH})
RELOAD_EVERY_S = 60.0  # how often a renewed certificate is looked for


class OpsOnly:
    """The app, restricted to the ops paths; /readyz is 503 until `started()`."""

    def __init__(self, app: ASGIApp, started: Callable[[], bool]) -> None:
        self.app = app
        self.started = started

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return  # no lifespan here (the API server runs it), no websockets
        path = scope["path"]
        if path not in OPS_PATHS:
            message = (
                f"{path}: the ops port serves {', '.join(sorted(OPS_PATHS))} only; the API is "
                "on the API port, over mTLS"
            )
            await _json(send, 404, {"error": {"code": "not_found", "message": message}})
            return
        if not self.started():
            if path == workloads.READY_PATH:
                await _json(send, 503, {"ready": False, "checks": {"started": False}})
                return
            if path == workloads.HEALTH_PATH:  # the process turns; the lifespan is still opening
                await _json(send, 200, {"status": "starting"})
                return
        await self.app(scope, receive, send)


async def _json(send: Send, status: int, body: object) -> None:
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(data))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


class _Quiet(uvicorn.Server):
    """A second server in the process: the first one owns the signal handlers."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class CertReloader:
    """Reloads the API's certificate folder into its context when cert-manager renews it (the
    mounted files change; new handshakes get the new pair, open connections keep theirs)."""

    def __init__(self, ctx: ssl.SSLContext, cert_dir: str) -> None:
        self.ctx = ctx
        self.cert_dir = cert_dir
        self.seen = self._stamp()

    def _stamp(self) -> tuple[float, ...]:
        keys = (tls.CERT_KEY, tls.KEY_KEY, tls.CA_KEY)
        return tuple(os.stat(os.path.join(self.cert_dir, k)).st_mtime for k in keys)

    def check(self) -> bool:
        """Reload if the files changed since the last look; True if it did."""
        try:
            stamp = self._stamp()
            if stamp == self.seen:
                return False
            # a pair caught half-written (a key that does not match its certificate) must not
            # reach the live context: loading it there would leave a certificate without its key
            tls.load_mtls_files(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), self.cert_dir)
            tls.load_mtls_files(self.ctx, self.cert_dir)
        except (OSError, ssl.SSLError) as e:  # half-written: the next look retries
            log.warning("certificate reload from %s failed: %s", self.cert_dir, e)
            return False
        self.seen = stamp
        log.info("reloaded the API certificate from %s", self.cert_dir)
        return True

    async def run(self, every_s: float = RELOAD_EVERY_S) -> None:
        while True:
            await asyncio.sleep(every_s)
            self.check()


def servers(
    app: ASGIApp, host: str, port: int, ops_port: int, tls_dir: str | None
) -> tuple[uvicorn.Server, uvicorn.Server, ssl.SSLContext | None]:
    """The API server (mTLS when `tls_dir`), the ops server, and the API's TLS context."""
    ctx = tls.mtls_server_context(tls_dir) if tls_dir else None
    api = uvicorn.Server(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            access_log=False,
            lifespan="on",
            # uvicorn builds no context itself: ours requires a client certificate from our CA
            ssl_context_factory=(lambda _config, _default: ctx) if ctx else None,
        )
    )
    ops = _Quiet(
        uvicorn.Config(
            OpsOnly(app, lambda: api.started),
            host=host,
            port=ops_port,
            access_log=False,
            lifespan="off",
        )
    )
    return api, ops, ctx


async def serve(app: ASGIApp, host: str, port: int, ops_port: int, tls_dir: str | None) -> int:
    api, ops, ctx = servers(app, host, port, ops_port, tls_dir)
    return await run(api, ops, ctx, tls_dir)


async def run(
    api: uvicorn.Server,
    ops: uvicorn.Server,
    ctx: ssl.SSLContext | None,
    tls_dir: str | None,
    reload_every_s: float = RELOAD_EVERY_S,
) -> int:
    """Until the API server stops (a signal, or `api.should_exit`); the ops server stops with it.
    0 if the API server had started."""
    ops_task = asyncio.create_task(ops.serve(), name="ops-server")
    reloader = CertReloader(ctx, tls_dir) if ctx and tls_dir else None
    reload_task = asyncio.create_task(reloader.run(reload_every_s)) if reloader else None
    try:
        await api.serve()
    finally:
        ops.should_exit = True
        if reload_task:
            reload_task.cancel()
        with contextlib.suppress(asyncio.CancelledError, SystemExit):
            await ops_task
    # uvicorn exits the process itself when the lifespan fails; a server that stopped without
    # having started (its port in use) is a failure too
    return 0 if api.started else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m services.common.serve", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("module", help="the module whose create_app() builds the ASGI app")
    p.add_argument("--host", default=workloads.BIND_ALL)
    p.add_argument("--port", type=int, default=workloads.HTTP_PORT, help="the API port")
    p.add_argument("--ops-port", type=int, default=workloads.OPS_PORT)
    p.add_argument(
        "--tls-dir",
        help=f"a folder with {tls.CA_KEY}, {tls.CERT_KEY} and {tls.KEY_KEY}: the API requires "
        "a client certificate from that CA. Without it the API is plain HTTP (the local "
        "plaintext profile).",
    )
    args = p.parse_args(argv)
    if args.port == args.ops_port:
        p.error(f"--ops-port must differ from --port ({args.port})")
    app = importlib.import_module(args.module).create_app()
    return asyncio.run(serve(app, args.host, args.port, args.ops_port, args.tls_dir))


if __name__ == "__main__":
    sys.exit(main())
