"""The hot-key control loop on the local stack: 4 hot-pool Redis instances (the production
design's 4 hot pools), the sampler, and the operator's reconcile loop (no Kubernetes API)."""

from __future__ import annotations

import sys

from local.components.base import Component, Server, http_probe
from local.components.redis import ping_probe, redis_server_bin
from local.components.services import STORES, PyService, service_env, uvicorn_app
from local.layout import HOST, Layout

HOT_POOLS = 4


def hot_pool_ports(layout: Layout) -> list[int]:
    return layout.ports.hot_pools[:HOT_POOLS]


def sampler_port(layout: Layout) -> int:
    return layout.ports.hotkey_sampler


def operator_port(layout: Layout) -> int:
    return layout.ports.hotkey_operator


def hot_pools_env(layout: Layout) -> str:
    return ",".join(f"{HOST}:{p}" for p in hot_pool_ports(layout))


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


class HotKeyOperator(Component):
    """The operator's reconcile loop; its policy is `/likes/flags/hotkey-policy` in etcd."""

    name = "hotkey-operator"
    requires = (*STORES, "hot-pools")

    def servers(self) -> list[Server]:
        port = operator_port(self.layout)
        env = {**service_env(self.layout), "LIKES_HOT_POOLS": hot_pools_env(self.layout)}
        return [
            Server(
                name=self.name,
                argv=[sys.executable, "-m", "operators.hotkeys", "--port", str(port)],
                address=f"http://{HOST}:{port}",
                probe=lambda: http_probe(f"http://{HOST}:{port}/readyz"),
                env=env,
                start_timeout=60,
                stop_timeout=10,
            )
        ]

    def metrics_targets(self) -> list[str]:
        return [f"{HOST}:{operator_port(self.layout)}"]


def build(layout: Layout) -> list[Component]:
    port = sampler_port(layout)
    sampler = PyService(
        layout,
        "hotkey-sampler",
        port,
        uvicorn_app("services.hotkey_sampler.main:create_app", port),
    )
    return [HotPools(layout), sampler, HotKeyOperator(layout)]
