"""Our own services and workers as local processes, configured through LIKES_* variables that
point at the stack's servers (the same settings production fills from its ConfigMaps)."""

from __future__ import annotations

import os
import sys

from local.components import kafka
from local.components.base import Component, Server, http_probe
from local.layout import HOST, REPO_ROOT, Layout

STORES = ("etcd", "idem-store", "count-cache", "kafka", "cassandra", "schema-registry")


def service_env(layout: Layout) -> dict[str, str]:
    """Settings (services.contracts.settings.Settings) for a process talking to this stack."""
    p = layout.ports
    pythonpath = os.pathsep.join(x for x in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if x)
    return {
        "PYTHONPATH": pythonpath,
        "LIKES_ENV": "local",
        "LIKES_REGION": "local",
        "LIKES_COUNT_CACHE_NODES": ",".join(f"{HOST}:{x}" for x in p.count_cache),
        "LIKES_IDEM_STORE_URL": f"redis://{HOST}:{p.idem_store}/0",
        "LIKES_CASSANDRA_HOSTS": HOST,
        "LIKES_CASSANDRA_PORT": str(p.cassandra_native),
        "LIKES_KAFKA_BOOTSTRAP": kafka.bootstrap_servers(layout),
        "LIKES_SCHEMA_REGISTRY_URL": f"http://{HOST}:{p.schema_registry}",
        "LIKES_ETCD_HOST": HOST,
        "LIKES_ETCD_PORT": str(p.etcd_client),
        "LIKES_SAMPLER_URL": f"http://{HOST}:{p.hotkey_sampler}",
    }


class PyService(Component):
    """One Python process: an HTTP service (uvicorn) or a worker serving /healthz + /metrics."""

    requires = STORES

    def __init__(self, layout: Layout, name: str, port: int, argv: list[str]) -> None:
        super().__init__(layout)
        self.name = name
        self.port = port
        self._argv = argv

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def servers(self) -> list[Server]:
        return [
            Server(
                name=self.name,
                argv=[sys.executable, *self._argv],
                address=self.url,
                probe=lambda: http_probe(f"{self.url}/readyz"),
                env=service_env(self.layout),
                start_timeout=60,
                stop_timeout=10,
            )
        ]

    def metrics_targets(self) -> list[str]:
        return [f"{HOST}:{self.port}"]


def uvicorn_app(factory: str, port: int) -> list[str]:
    return [
        "-m", "uvicorn", factory, "--factory", "--host", HOST, "--port", str(port),
        "--no-access-log", "--log-level", "warning",
    ]  # fmt: skip


def build(layout: Layout) -> list[Component]:
    p = layout.ports
    write, read = "services.write.main:create_app", "services.read.main:create_app"
    return [
        PyService(layout, "write", p.write, uvicorn_app(write, p.write)),
        PyService(layout, "read", p.read, uvicorn_app(read, p.read)),
        PyService(
            layout, "outbox-relay", p.relay, ["-m", "services.relay", "--port", str(p.relay)]
        ),
        PyService(
            layout,
            "aggregator",
            p.aggregator,
            ["-m", "services.aggregator", "--port", str(p.aggregator)],
        ),
    ]
