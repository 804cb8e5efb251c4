"""The hot pools: plain Redis instances holding read replicas of hot posts' `count:{post}` hash.

A copy is written only if its `gen` is newer than the replica's (a slow refresh never rolls a
replica back) and carries a TTL, so a replica the operator stops refreshing dies on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster

from services.contracts import hotkeys, keys

_COPY = hotkeys.HOT_COPY_LUA


def source_cluster(
    nodes: Sequence[tuple[str, int]], timeout_s: float = 0.5, password: str | None = None
) -> RedisCluster:
    return RedisCluster(
        startup_nodes=[ClusterNode(h, p) for h, p in nodes],
        password=password,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        decode_responses=True,
    )


class HotPools:
    def __init__(
        self,
        addresses: Sequence[tuple[str, int]],
        timeout_s: float = 0.5,
        password: str | None = None,
    ) -> None:
        self.addresses = [f"{h}:{p}" for h, p in addresses]
        self.clients: list[Redis] = []
        for host, port in addresses:
            self.clients.append(
                Redis(
                    host=host,
                    port=port,
                    password=password,
                    socket_timeout=timeout_s,
                    socket_connect_timeout=timeout_s,
                    decode_responses=True,
                )
            )
        self._copy = [c.register_script(_COPY) for c in self.clients]

    def pick(self, replication_factor: int) -> list[int]:
        return list(range(min(replication_factor, len(self.clients))))

    async def copy(
        self, post_id: str, source: Mapping[Any, Any], ttl_s: int, pools: Sequence[int]
    ) -> list[Exception]:
        """Write the source hash into the chosen pools; the errors of pools that failed."""
        args = hotkeys.copy_args(source, ttl_s)
        results = await asyncio.gather(
            *(self._copy[i](keys=[keys.count_key(post_id)], args=args) for i in pools),
            return_exceptions=True,
        )
        return [r for r in results if isinstance(r, Exception)]

    async def drop(self, post_id: str) -> list[Exception]:
        results = await asyncio.gather(
            *(c.delete(keys.count_key(post_id)) for c in self.clients), return_exceptions=True
        )
        return [r for r in results if isinstance(r, Exception)]

    async def close(self) -> None:
        for c in self.clients:
            with contextlib.suppress(Exception):
                await c.aclose()
