"""etcd (Debian's etcd-server): the config store for hot keys, CDN heat and kill switches.

One member locally; production runs five (infra/etcd.py). Authentication is on, as in production:
the first bootstrap creates root and the services' user from the stack's secrets file and enables
it (through the gRPC API: no password on a command line), so every client of ours logs in here.
"""

from __future__ import annotations

import asyncio
import shutil

import httpx

from local.components.base import Component, ProbeFailed, Server
from local.layout import HOST, Layout
from services.contracts import etcd
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
    def url(self) -> str:
        return f"http://{HOST}:{self.layout.ports.etcd_client}"

    def servers(self) -> list[Server]:
        peer = f"http://{HOST}:{self.layout.ports.etcd_peer}"
        argv = [
            shutil.which("etcd") or "/usr/bin/etcd",
            "--name=local",
            f"--data-dir={self.layout.data / 'etcd'}",
            f"--listen-client-urls={self.url}",
            f"--advertise-client-urls={self.url}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=local={peer}",
            "--initial-cluster-state=new",
            "--log-level=warn",
            "--logger=zap",
        ]
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
            r = httpx.get(f"{self.url}/health", timeout=2)
            healthy = r.status_code == 200 and r.json().get("health") == "true"
        except (httpx.HTTPError, ValueError) as e:
            raise ProbeFailed(f"etcd: {e}") from e
        if not healthy:
            raise ProbeFailed(f"etcd /health: {r.status_code} {r.text[:200]}")

    def bootstrap(self) -> None:
        from local import transforms

        root = transforms.stack_secrets(self.layout)[transforms.ETCD_ROOT]
        port = self.layout.ports.etcd_client
        asyncio.run(etcd_auth.apply(HOST, port, root, credentials(self.layout)))

    def metrics_targets(self) -> list[str]:
        return [f"{HOST}:{self.layout.ports.etcd_client}"]
