"""etcd (Debian's etcd-server): the config store for hot keys, CDN heat and kill switches.

One member locally; production runs five (infra/etcd.py). The --tls profile serves both ports
with TLS, with the program's flags (infra/etcd.py `server_tls_flags`) on the local CA's files;
/health and /metrics stay plain HTTP on their own port, as in production.

Authentication is on, as in production: the first bootstrap creates root and the services' user
from the stack's secrets file and enables it (through the gRPC API: no password on a command
line), so every client of ours logs in here.
"""

from __future__ import annotations

import asyncio
import shutil

import grpc
import httpx
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

from local import tls as local_tls
from local.components.base import Component, ProbeFailed, Server
from local.layout import HOST, Layout
from services.contracts import etcd, tls
from services.schema import etcd_auth

BOOTSTRAP_PATIENCE_S = 120.0
_TRANSIENT = (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE)


def _transient(e: BaseException) -> bool:
    """etcd did not answer in time (or not yet): worth another try. The applier wraps the RPC
    error (etcd_auth.AuthSetupError from AioRpcError)."""
    rpc = e if isinstance(e, grpc.aio.AioRpcError) else e.__cause__
    return isinstance(rpc, grpc.aio.AioRpcError) and rpc.code() in _TRANSIENT


def credentials(layout: Layout) -> etcd.Credentials:
    """The services' login (the program's etcd-auth secret, played by the stack's secret file)."""
    from local import transforms

    return etcd.Credentials(
        etcd.SERVICE_USER, transforms.stack_secrets(layout)[transforms.ETCD_AUTH]
    )


class Etcd(Component):
    name = "etcd"

    @property
    def scheme(self) -> str:
        return "https" if self.layout.tls else "http"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{HOST}:{self.layout.ports.etcd_client}"

    @property
    def metrics_url(self) -> str:
        return f"http://{HOST}:{self.layout.ports.etcd_metrics}"

    def prepare(self) -> None:
        if self.layout.tls:
            local_tls.ensure(self.layout)

    def servers(self) -> list[Server]:
        from infra.etcd import server_tls_flags

        peer = f"{self.scheme}://{HOST}:{self.layout.ports.etcd_peer}"
        argv = [
            shutil.which("etcd") or "/usr/bin/etcd",
            "--name=local",
            f"--data-dir={self.layout.data / 'etcd'}",
            f"--listen-client-urls={self.url}",
            f"--advertise-client-urls={self.url}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=local={peer}",
            f"--listen-metrics-urls={self.metrics_url}",
            "--initial-cluster-state=new",
            "--log-level=warn",
            "--logger=zap",
        ]
        if self.layout.tls:
            argv += server_tls_flags(str(local_tls.server_dir(self.layout, tls.ETCD)))
        return [
            Server(
                name="etcd",
                argv=argv,
                address=f"{HOST}:{self.layout.ports.etcd_client}",
                probe=self.probe,
                start_timeout=30,
                stop_timeout=10,
            )
        ]

    def probe(self) -> None:
        try:
            r = httpx.get(f"{self.metrics_url}/health", timeout=2)
            healthy = r.status_code == 200 and r.json().get("health") == "true"
        except (httpx.HTTPError, ValueError) as e:
            raise ProbeFailed(f"etcd: {e}") from e
        if not healthy:
            raise ProbeFailed(f"etcd /health: {r.status_code} {r.text[:200]}")

    def bootstrap(self) -> None:
        from local import transforms

        root = transforms.stack_secrets(self.layout)[transforms.ETCD_ROOT]
        port = self.layout.ports.etcd_client
        ca = local_tls.client_ca(self.layout)
        # a member that has just (re)started can take seconds to answer a login (a TLS handshake
        # and bcrypt, on a loaded 2-core machine): retry what times out, as the program's Job is
        # retried by its backoffLimit; a refused password fails at once
        for attempt in Retrying(
            stop=stop_after_delay(BOOTSTRAP_PATIENCE_S),
            wait=wait_exponential(multiplier=0.5, max=5),
            retry=retry_if_exception(_transient),
            reraise=True,
        ):
            with attempt:
                asyncio.run(
                    etcd_auth.apply(
                        HOST, port, root, credentials(self.layout), timeout=15.0, ca_file=ca
                    )
                )

    def metrics_targets(self) -> list[str]:
        return [f"{HOST}:{self.layout.ports.etcd_metrics}"]
