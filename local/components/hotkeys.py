"""The hot pools on the local stack: 4 Redis instances (the production design's 4 hot pools).
The sampler and the operator's reconcile loop are rendered workloads (components/services.py)."""

from __future__ import annotations

from local.components.base import Component, Server
from local.components.redis import ping_probe, redis_server_bin
from local.layout import HOST, Layout

HOT_POOLS = 4


def hot_pool_ports(layout: Layout) -> list[int]:
    return layout.ports.hot_pools[:HOT_POOLS]


class HotPools(Component):
    name = "hot-pools"

    def servers(self) -> list[Server]:
        # replicas only: no persistence, bounded memory, evict what has a TTL (all of it)
        return [
            Server(
                name=f"hot-pool-{i + 1}",
                argv=[
                    redis_server_bin(), "--bind", HOST, "--port", str(port),
                    "--protected-mode", "no", "--save", "", "--appendonly", "no",
                    "--maxmemory", "64mb", "--maxmemory-policy", "volatile-lru",
                    "--dir", str(self.layout.data),
                ],
                address=f"{HOST}:{port}",
                probe=lambda port=port: ping_probe(port),  # type: ignore[misc]
                start_timeout=30,
                stop_timeout=10,
            )
            for i, port in enumerate(hot_pool_ports(self.layout))
        ]  # fmt: skip

    def prepare(self) -> None:
        self.layout.ensure()


def build(layout: Layout) -> list[Component]:
    return [HotPools(layout)]
