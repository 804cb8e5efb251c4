"""Per-post CDN heat → the `Cache-Control: max-age` of anonymous answers.

A viral post gets a short edge TTL (5 s) so its count moves; a cold post 30 s. The heat hint lives
in etcd at `/likes/heat/<post_id>` ("hot", or a TTL in seconds); the hot-key sampler will write it.
`HeatSource` is the seam: the read service only asks `ttl(post_id)`, which must never block or
fail, so the etcd implementation serves an in-memory copy refreshed in the background and keeps
the last known values while etcd is unreachable, for the control plane's grace period (5 minutes,
`hotkeys.GRACE_S`); after that the hints expire and every post reads as cold (30 s), the default.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Protocol

import aetcd

from services.contracts import etcd, flags, keys
from services.contracts.hotkeys import GRACE_S, LastGood

log = logging.getLogger("read.heat")

HOT_TTL_S = 5
COLD_TTL_S = 30


def ttl_for(hint: str | None) -> int:
    """The edge TTL for a heat hint: "hot" → 5 s, a number → that many seconds clamped to
    [5, 30], anything else (no hint, garbage) → 30 s."""
    if hint is None:
        return COLD_TTL_S
    hint = hint.strip().lower()
    if hint in ("hot", "viral"):
        return HOT_TTL_S
    try:
        seconds = int(float(hint))
    except ValueError:
        return COLD_TTL_S
    return min(COLD_TTL_S, max(HOT_TTL_S, seconds))


class HeatSource(Protocol):
    def ttl(self, post_id: str) -> int: ...
    async def start(self) -> None: ...
    async def close(self) -> None: ...


class StaticHeat:
    """Fixed hints (tests, benchmarks, a service without etcd)."""

    def __init__(self, hints: Mapping[str, str] | None = None) -> None:
        self.hints = dict(hints or {})

    def ttl(self, post_id: str) -> int:
        return ttl_for(self.hints.get(post_id))

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None


class SwitchedHeat:
    """`inner`, unless the `panic` kill switch is engaged: then every post is cold (the hints are
    runtime control state, which panic stops relying on)."""

    def __init__(self, inner: HeatSource, switches: flags.Switches) -> None:
        self.inner, self.switches = inner, switches

    def ttl(self, post_id: str) -> int:
        if self.switches.engaged(flags.Switch.PANIC):
            return COLD_TTL_S
        return self.inner.ttl(post_id)

    async def start(self) -> None:
        await self.inner.start()

    async def close(self) -> None:
        await self.inner.close()


class EtcdHeat:
    """Polls the heat prefix (a small set: only hot posts carry a hint) every `interval_s`.

    The hints of the last successful poll are served for `grace_s` after it; a longer etcd
    outage expires them (cold defaults) rather than pinning a post hot or cold forever."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        interval_s: float = 1.0,
        timeout_s: float = 1.0,
        grace_s: float = GRACE_S,
        clock: Callable[[], float] = time.monotonic,
        credentials: etcd.Credentials | None = None,
        ca_file: str | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.credentials, self.ca_file = credentials, ca_file
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.last_good: LastGood[dict[str, str]] = LastGood({}, grace_s, clock)
        self.last_ok = False
        self._task: asyncio.Task[None] | None = None
        self._client: aetcd.Client | None = None

    @property
    def hints(self) -> dict[str, str]:
        """The hints in force: the last poll's, or none once they have expired."""
        return self.last_good.get()

    def ttl(self, post_id: str) -> int:
        return ttl_for(self.hints.get(post_id))

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="heat-poll")

    async def close(self) -> None:
        task, self._task = self._task, None
        client, self._client = self._client, None
        await etcd.stop_poller(task, client)

    async def refresh(self) -> None:
        """One poll; raises if etcd is unreachable (the previous hints stay, until they expire)."""
        if self._client is None:
            self._client = etcd.client(
                self.host, self.port, self.credentials, self.timeout_s, self.ca_file
            )
        prefix = keys.HEAT_PREFIX.encode()
        client = await etcd.connected(self._client)  # a login has its own, longer deadline
        result = await asyncio.wait_for(client.get_prefix(prefix), self.timeout_s)
        hints: dict[str, str] = {}
        for kv in result:
            post_id = kv.key[len(prefix) :].decode(errors="replace")
            hints[post_id] = kv.value.decode(errors="replace")
        self.last_good.ok(hints)  # swap whole: readers never see a half-built map

    async def _run(self) -> None:
        while True:
            try:
                await self.refresh()
                if not self.last_ok:
                    log.info("heat hints loaded", extra={"fields": {"posts": len(self.hints)}})
                self.last_ok = True
            except asyncio.CancelledError:
                raise
            except Exception as e:  # etcd down: the last known hints, until they expire
                if self.last_ok:
                    log.warning("etcd unreachable; keeping last heat hints for the grace period",
                                extra={"fields": {"error": repr(e)}})  # fmt: skip
                self.last_ok = False
                await self._drop_client()
            await asyncio.sleep(self.interval_s)

    async def _drop_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await client.close()
