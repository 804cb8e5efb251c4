"""services/common/serve.py on loopback: the API requires a client certificate from the platform
CA (gateway -> service mTLS), the ops port serves probes and metrics only and in plain HTTP,
/readyz waits for the lifespan, and a renewed certificate is served without a restart."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from local import layout
from local import tls as local_tls
from services.common import http, serve
from services.contracts import tls, workloads


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Running:
    api_url: str
    ops_url: str
    certs: layout.Layout  # the platform CA and its certificates
    opened: threading.Event  # set: the lifespan may finish opening


def _app(opened: threading.Event) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        while not opened.is_set():  # the stores are being opened
            await asyncio.sleep(0.02)
        yield

    app = FastAPI(lifespan=lifespan)
    http.install(app, "serve-test")

    @app.get("/v1/echo")
    async def echo() -> dict[str, str]:
        return {"ok": "yes"}

    return app


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Running]:
    certs = layout.Layout(home=tmp_path / "ca", ports=layout.Ports(0), tls=True)
    local_tls.ensure(certs)
    cert_dir = str(local_tls.workload_dir(certs, workloads.READ.name))
    opened = threading.Event()
    port, ops_port = _free_port(), _free_port()
    api, ops, ctx = serve.servers(_app(opened), "127.0.0.1", port, ops_port, cert_dir)
    code: list[int] = []
    thread = threading.Thread(
        target=lambda: code.append(asyncio.run(serve.run(api, ops, ctx, cert_dir, 0.05))),
        daemon=True,
    )
    thread.start()
    ops_url = f"http://127.0.0.1:{ops_port}"
    deadline = time.monotonic() + 30
    while True:  # the ops port answers before the lifespan has opened anything
        try:
            httpx.get(f"{ops_url}{workloads.HEALTH_PATH}", timeout=1)
            break
        except httpx.TransportError:
            assert time.monotonic() < deadline, "the ops server did not start"
            time.sleep(0.05)
    yield Running(f"https://127.0.0.1:{port}", ops_url, certs, opened)
    api.should_exit = True
    thread.join(timeout=30)
    assert not thread.is_alive(), "the servers did not stop"
    assert code == [0]


def _wait_ready(r: Running) -> None:
    r.opened.set()
    deadline = time.monotonic() + 30
    while httpx.get(f"{r.ops_url}{workloads.READY_PATH}", timeout=2).status_code != 200:
        assert time.monotonic() < deadline, "never ready"
        time.sleep(0.05)


def _client(r: Running, cert_dir: Path | None) -> httpx.Client:
    ca = str(local_tls.ca_file(r.certs))
    ctx = tls.mtls_client_context(str(cert_dir)) if cert_dir else tls.client_context(ca)
    return httpx.Client(verify=ctx, timeout=5)


def test_the_api_requires_a_client_certificate_from_the_platform_ca(
    running: Running, tmp_path: Path
) -> None:
    _wait_ready(running)
    gateway = local_tls.workload_dir(running.certs, tls.GATEWAY)
    with _client(running, gateway) as c:
        r = c.get(f"{running.api_url}/v1/echo")
    assert r.status_code == 200 and r.json() == {"ok": "yes"}
    # no certificate: the handshake is refused before any request is read
    with _client(running, None) as c, pytest.raises(httpx.TransportError):
        c.get(f"{running.api_url}/v1/echo")
    # a certificate from another CA (another stack's): refused too
    other = layout.Layout(home=tmp_path / "other", ports=layout.Ports(0), tls=True)
    local_tls.ensure(other)
    ctx = tls.client_context(str(local_tls.ca_file(running.certs)))
    foreign = local_tls.workload_dir(other, tls.GATEWAY)
    ctx.load_cert_chain(foreign / tls.CERT_KEY, foreign / tls.KEY_KEY)
    with httpx.Client(verify=ctx, timeout=5) as c, pytest.raises(httpx.TransportError):
        c.get(f"{running.api_url}/v1/echo")
    # plain HTTP on the API port is not an API either
    with pytest.raises(httpx.TransportError):
        httpx.get(running.api_url.replace("https", "http") + "/v1/echo", timeout=5)


def test_the_ops_port_serves_probes_and_metrics_in_plain_http_and_nothing_else(
    running: Running,
) -> None:
    ready = f"{running.ops_url}{workloads.READY_PATH}"
    before = httpx.get(ready, timeout=5)
    assert before.status_code == 503 and before.json()["checks"] == {"started": False}
    assert httpx.get(f"{running.ops_url}{workloads.HEALTH_PATH}", timeout=5).status_code == 200
    _wait_ready(running)
    assert httpx.get(ready, timeout=5).status_code == 200
    metrics = httpx.get(f"{running.ops_url}{workloads.METRICS_PATH}", timeout=5)
    assert metrics.status_code == 200 and "# TYPE" in metrics.text
    api_on_ops = httpx.get(f"{running.ops_url}/v1/echo", timeout=5)
    assert api_on_ops.status_code == 404
    assert api_on_ops.json()["error"]["code"] == "not_found"


def test_a_renewed_certificate_is_served_without_a_restart(running: Running) -> None:
    _wait_ready(running)
    folder = local_tls.workload_dir(running.certs, workloads.READ.name)

    def served_cn() -> str:
        ctx = tls.mtls_client_context(str(local_tls.workload_dir(running.certs, tls.GATEWAY)))
        port = int(running.api_url.rsplit(":", 1)[1])
        with (
            socket.create_connection(("127.0.0.1", port)) as s,
            ctx.wrap_socket(s, server_hostname="127.0.0.1") as t,
        ):
            cert = t.getpeercert()
        return str(dict(x[0] for x in cert["subject"])["commonName"])

    assert served_cn() == f"{workloads.READ.name}.local"
    # cert-manager renews: the pair is rewritten (here: the write service's pair, same CA)
    renewed = local_tls.workload_dir(running.certs, workloads.WRITE.name)
    for key in (tls.KEY_KEY, tls.CERT_KEY):
        tmp = folder / f".{key}.new"
        shutil.copy(renewed / key, tmp)
        os.replace(tmp, folder / key)
    deadline = time.monotonic() + 20
    while served_cn() != f"{workloads.WRITE.name}.local":
        assert time.monotonic() < deadline, "the renewed certificate was never served"
        time.sleep(0.05)


def test_the_ops_and_api_ports_must_differ() -> None:
    out = subprocess.run(
        [sys.executable, "-m", workloads.SERVE_MODULE, workloads.READ.module,
         "--port", "8080", "--ops-port", "8080"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2 and "--ops-port must differ" in out.stderr
