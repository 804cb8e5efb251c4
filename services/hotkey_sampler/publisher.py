"""Publishes the sampler's top-K to etcd on one lease: `/likes/hotkeys/<post>` and the CDN heat
hint `/likes/heat/<post>`. If the sampler dies, the lease lapses and every flag goes with it.

Each tick writes only the difference from what is published (new posts, rates that moved by a
quarter, posts that left the top-K), so a steady hot set costs etcd nothing but the keep-alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aetcd
from aetcd.leases import Lease

from services.contracts import etcd, hotkeys, keys

log = logging.getLogger("hotkey_sampler.publisher")


@dataclass
class Published:
    rates: dict[str, float] = field(default_factory=dict)
    heat: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class Diff:
    put_hot: dict[str, float]
    delete_hot: list[str]
    put_heat: list[str]
    delete_heat: list[str]

    @property
    def empty(self) -> bool:
        return not (self.put_hot or self.delete_hot or self.put_heat or self.delete_heat)


def diff(
    published: Published, top: list[tuple[str, float]], heat_rate: float, moved: float = 0.25
) -> Diff:
    """What to write so etcd shows `top` (pure)."""
    want = dict(top)
    put_hot = {
        p: r
        for p, r in want.items()
        if p not in published.rates
        or abs(r - published.rates[p]) > moved * max(published.rates[p], 1.0)
    }
    hot_now = {p for p, r in want.items() if r >= heat_rate}
    return Diff(
        put_hot=put_hot,
        delete_hot=sorted(set(published.rates) - set(want)),
        put_heat=sorted(hot_now - published.heat),
        delete_heat=sorted(published.heat - hot_now),
    )


class EtcdPublisher:
    def __init__(
        self,
        host: str,
        port: int,
        *,
        lease_ttl_s: int = 5,
        timeout_s: float = 1.0,
        clock: Callable[[], int] = hotkeys.now_ms,
        credentials: etcd.Credentials | None = None,
        ca_file: str | None = None,
    ) -> None:
        self.host, self.port, self.credentials = host, port, credentials
        self.ca_file = ca_file
        self.lease_ttl_s, self.timeout_s = lease_ttl_s, timeout_s
        self.clock = clock
        self.published = Published()
        self._client: aetcd.Client | None = None
        self._lease: Lease | None = None
        self._refreshed = 0.0

    async def _ensure(self) -> tuple[aetcd.Client, Lease]:
        if self._client is None:
            self._client = etcd.client(
                self.host, self.port, self.credentials, self.timeout_s, self.ca_file
            )
        await etcd.connected(self._client)  # a login has its own, longer deadline
        if self._lease is None:
            self._lease = await self._client.lease(self.lease_ttl_s)
            self._refreshed = time.monotonic()
            self.published = Published()  # keys on a lapsed lease are gone: write all again
        return self._client, self._lease

    async def keep_alive(self) -> None:
        """Refresh the lease (a third of its TTL apart); a lapsed lease is replaced."""
        _, lease = await self._ensure()
        if time.monotonic() - self._refreshed < self.lease_ttl_s / 3:
            return
        reply = await asyncio.wait_for(lease.refresh(), self.timeout_s)
        if reply is None or reply.TTL <= 0:
            log.warning("sampler lease lapsed; publishing on a new one")
            self._lease = None
            await self._ensure()
        else:
            self._refreshed = time.monotonic()

    async def publish(self, top: list[tuple[str, float]], heat_rate: float) -> Diff:
        await self.keep_alive()
        client, lease = await self._ensure()
        d = diff(self.published, top, heat_rate)
        ts = self.clock()
        for p, r in d.put_hot.items():
            await client.put((keys.HOTKEYS_PREFIX + p).encode(), hotkeys.encode_hot(r, ts), lease)
            self.published.rates[p] = r
        for p in d.put_heat:
            await client.put((keys.HEAT_PREFIX + p).encode(), b"hot", lease)
            self.published.heat.add(p)
        for p in d.delete_hot:
            await client.delete((keys.HOTKEYS_PREFIX + p).encode())
            self.published.rates.pop(p, None)
        for p in d.delete_heat:
            await client.delete((keys.HEAT_PREFIX + p).encode())
            self.published.heat.discard(p)
        return d

    async def reset(self) -> None:
        """Forget the connection (after an error): the next publish reconnects and rewrites."""
        client, self._client, self._lease = self._client, None, None
        if client is not None:
            with contextlib.suppress(Exception):
                await client.close()

    async def close(self, revoke: bool = True) -> None:
        if revoke and self._lease is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._lease.revoke(), self.timeout_s)
        await self.reset()
