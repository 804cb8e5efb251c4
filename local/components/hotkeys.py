"""The hot pools on the local stack: 4 Redis instances (the production design's 4 hot pools).
The sampler and the operator's reconcile loop are rendered workloads (components/services.py)."""

from __future__ import annotations

from pathlib import Path

from infra import redis as redis_infra
from local.components.base import Component, Server
from local.components.redis import auth_lines, ping_probe, redis_server_bin
from local.layout import HOST, Layout
from services.contracts import keys

HOT_POOLS = 4


def hot_pool_ports(layout: Layout) -> list[int]:
    return layout.ports.hot_pools[:HOT_POOLS]


class HotPools(Component):
    name = "hot-pools"

    def conf(self, port: int) -> Path:
        return self.layout.conf / f"hot-pool-{port}.conf"

    def servers(self) -> list[Server]:
        return [
            Server(
                name=f"hot-pool-{i + 1}",
                argv=[redis_server_bin(), str(self.conf(port))],
                address=f"{HOST}:{port}",
                probe=lambda port=port: ping_probe(self.layout, port),  # type: ignore[misc]
                start_timeout=30,
                stop_timeout=10,
            )
            for i, port in enumerate(hot_pool_ports(self.layout))
        ]

    def scrape_targets(self) -> dict[str, list[str]]:
        # each pool plays its own rendered StatefulSet
        ports = hot_pool_ports(self.layout)
        return {redis_infra.hot_pool(i): [f"{HOST}:{port}"] for i, port in enumerate(ports)}

    def prepare(self) -> None:
        self.layout.ensure()
        for port in hot_pool_ports(self.layout):
            # replicas only: no persistence, bounded memory, evicting as the program's pools;
            # a file, so the password is never in argv
            lines = [
                f"bind {HOST}", f"port {port}", "protected-mode no", 'save ""',
                "appendonly no", "maxmemory 64mb",
                f"maxmemory-policy {keys.EVICTION_POLICY['hot-pool']}",
                f"dir {self.layout.data}", *auth_lines(self.layout), "",
            ]  # fmt: skip
            path = self.conf(port)
            path.touch(mode=0o600)
            path.chmod(0o600)
            path.write_text("\n".join(lines))


def build(layout: Layout) -> list[Component]:
    return [HotPools(layout)]
