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

import httpx

from local import tls as local_tls
from local.components.base import Component, ProbeFailed, Server
from local.layout import HOST, Layout
from services.contracts import etcd, tls
from services.schema import etcd_auth


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
        asyncio.run(etcd_auth.apply(HOST, port, root, credentials(self.layout), ca_file=ca))

    def metrics_targets(self) -> list[str]:
        return [f"{HOST}:{self.layout.ports.etcd_metrics}"]
