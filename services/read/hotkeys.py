"""The read path's part in the hot-key loop (the gateway mirrors reads to the sampler; the read
service only reads hot posts from the hot pools).

- `HotPoolCountCache`: hot posts read their aggregate from a random hot pool, others (and any
  pool miss or error) from the count-cache. A post is hot when the operator lists its pools
  (`/likes/hotpool/<post>`) or, before any sampler flags it, when this pod's own reads of it
  reached `hotkeys.LOCAL_HOT_READS_PER_S` in the last second (`LocalHeat`): the aggregator has
  copied every post liked in the last 5 minutes into every pool (always-replicate,
  contracts/hotkeys.py), so a flash spike moves off its count-cache shard within a second.
  A replica read gets one attempt within `timeout_s` (no client retries: redis-py's default of
  10 with backoff would outlast the Reader's deadline and fail the cold posts of the batch too).
- A pool MISS for a post routed there is filled from the count-cache behind the read (read-fill):
  a post liked more than 5 minutes ago has no always-replicate copy left, and one read at a few
  hundred reads a second is hot on this pod but under the operator's enter rate, so nothing else
  would ever copy it and every read would miss in the pool and land on its count-cache shard
  anyway (the count-cache-hot-key-under-replicated game day found it). The fill is the
  operator's copy (`HOT_COPY_LUA`): gen-guarded, so it never rolls back a newer copy the
  aggregator or the operator wrote meanwhile, with the always-replicate TTL, so a copy nobody
  reads or refreshes dies; at most one per pool and post every FILL_EVERY_S, off the request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence

from prometheus_client import Counter
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript

from services.contracts import flags, hotkeys, keys
from services.contracts import metrics as metric_names
from services.read.core import Aggregate, CountCache
from services.read.metrics import Children
from services.read.stores import AGGREGATE_FIELDS, parse_aggregate

log = logging.getLogger("read.hotkeys")

HOT_POOL_READS = Counter(metric_names.READ_HOT_POOL, "Hot-pool reads", ["result"])
_HOT_POOL_READS = Children(HOT_POOL_READS)
HOT_POOL_FILLS = Counter(
    metric_names.READ_HOT_POOL_FILLS,
    "Hot-pool misses filled from the count-cache, by result (written; stale: the pool already "
    "had a newer gen; empty: nothing counted yet; error)",
    ["result"],
)
_HOT_POOL_FILLS = Children(HOT_POOL_FILLS)
FILL_EVERY_S = 1.0  # at most one fill per pool and post a second, however many reads miss
_FILLS_REMEMBERED = 10_000  # (pool, post) fill times kept before the old ones are dropped
LOCALLY_HOT = Counter(
    "likes_read_locally_hot_total",
    "Post reads sent to the hot pools by this pod's own read rate, before any operator flag",
)


class LocalHeat:
    """This pod's reads per post in whole seconds: a post read at least `threshold` times in the
    previous second is hot now. Two dicts, the current second's and the last one's, so memory is
    the posts read in two seconds and a read costs one dict increment."""

    def __init__(
        self,
        threshold: int = hotkeys.LOCAL_HOT_READS_PER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.threshold, self.clock = threshold, clock
        self._second = int(clock())
        self._now: dict[str, int] = {}
        self._last: dict[str, int] = {}

    def _roll(self) -> None:
        second = int(self.clock())
        if second != self._second:
            self._last = self._now if second == self._second + 1 else {}
            self._now, self._second = {}, second

    def hit(self, post_id: str) -> bool:
        """Count one read; True if the post is hot (by the previous second's reads)."""
        self._roll()
        self._now[post_id] = self._now.get(post_id, 0) + 1
        return self._last.get(post_id, 0) >= self.threshold


class HotPoolCountCache:
    """A CountCache that sends hot posts' aggregate reads to a hot-pool replica."""

    def __init__(
        self,
        inner: CountCache,
        view: hotkeys.PrefixView[list[str]],
        *,
        timeout_s: float = 0.2,
        rng: random.Random | None = None,
        password: str | None = None,
        pools: Sequence[str] = (),
        local_heat: LocalHeat | None = None,
        switches: flags.Switches | None = None,
        fill_from: Callable[[str], Awaitable[Mapping[bytes, bytes]]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`pools`: every hot pool's host:port, read for a post this pod finds hot on its own
        (`local_heat`); without them only the operator's flags route reads to the pools. With the
        `panic` kill switch engaged in `switches`, every read goes to the count-cache.
        `fill_from(post)`: the post's whole count-cache hash, copied into a pool that missed it
        (no fills without it)."""
        self.inner, self.view, self.timeout_s = inner, view, timeout_s
        self.switches = switches
        self.password = password
        self.pools = list(pools)
        self.local_heat = local_heat if local_heat is not None else LocalHeat()
        self.rng = rng or random.Random()
        self.fill_from, self.clock = fill_from, clock
        self._clients: dict[str, Redis] = {}
        self._copy: dict[str, AsyncScript] = {}
        self._filled: dict[tuple[str, str], float] = {}  # (pool, post) -> last fill started
        self._fills: set[asyncio.Task[None]] = set()

    def _client(self, address: str) -> Redis:
        c = self._clients.get(address)
        if c is None:
            host, port = address.rsplit(":", 1)
            c = Redis(
                host=host,
                port=int(port),
                password=self.password,
                socket_timeout=self.timeout_s,
                socket_connect_timeout=self.timeout_s,
                retry=Retry(NoBackoff(), 0),  # the fall-back is the count-cache, not a retry
            )
            self._clients[address] = c
        return c

    async def _replica(self, post_id: str, pools: list[str]) -> Aggregate | None:
        address = self.rng.choice(pools)
        try:
            client = self._client(address)
            async with asyncio.timeout(self.timeout_s):
                raw = await client.hmget(keys.count_key(post_id), AGGREGATE_FIELDS)
        except Exception:
            _HOT_POOL_READS["error"].inc()
            return None
        agg = parse_aggregate(raw)
        _HOT_POOL_READS["hit" if agg is not None else "miss"].inc()
        if agg is None:
            self._schedule_fill(post_id, address)
        return agg

    def _schedule_fill(self, post_id: str, address: str) -> None:
        if self.fill_from is None:
            return
        now, key = self.clock(), (address, post_id)
        last = self._filled.get(key)
        if last is not None and now - last < FILL_EVERY_S:
            return  # one fill is enough: the reads that miss meanwhile fall back
        if len(self._filled) >= _FILLS_REMEMBERED:
            self._filled = {k: t for k, t in self._filled.items() if now - t < FILL_EVERY_S}
        self._filled[key] = now
        task = asyncio.create_task(self._fill(post_id, address))
        self._fills.add(task)
        task.add_done_callback(self._fills.discard)

    async def _fill(self, post_id: str, address: str) -> None:
        assert self.fill_from is not None
        try:
            source = await asyncio.wait_for(self.fill_from(post_id), self.timeout_s)
            if not source:
                _HOT_POOL_FILLS["empty"].inc()
                return
            copy = self._copy.get(address)
            if copy is None:
                copy = self._copy[address] = self._client(address).register_script(
                    hotkeys.HOT_COPY_LUA
                )
            args = hotkeys.copy_args(source, hotkeys.ALWAYS_REPLICATE_TTL_S)
            written = await asyncio.wait_for(
                copy(keys=[keys.count_key(post_id)], args=args), self.timeout_s
            )
        except Exception as e:
            _HOT_POOL_FILLS["error"].inc()
            log.debug("hot-pool fill failed", extra={"fields": {"pool": address, "error": repr(e)}})
            return
        _HOT_POOL_FILLS["written" if written else "stale"].inc()

    async def aggregates(self, post_ids: Sequence[str]) -> list[Aggregate | Exception | None]:
        if self.switches is not None and self.switches.engaged(flags.Switch.PANIC):
            return await self.inner.aggregates(post_ids)
        flagged = self.view.current()
        hot: dict[str, list[str]] = {}
        for p in post_ids:
            locally = self.local_heat.hit(p)
            if flagged.get(p):
                hot[p] = flagged[p]
            elif locally and self.pools:
                hot[p] = self.pools
                LOCALLY_HOT.inc()
        if not hot:  # the common case: nothing hot on the page
            return await self.inner.aggregates(post_ids)
        hot_ids = list(hot)
        found = await asyncio.gather(*(self._replica(p, hot[p]) for p in hot_ids))
        got = {p: a for p, a in zip(hot_ids, found, strict=True) if a is not None}
        rest = [p for p in post_ids if p not in got]
        inner = await self.inner.aggregates(rest) if rest else []
        from_inner = dict(zip(rest, inner, strict=True))
        return [got[p] if p in got else from_inner[p] for p in post_ids]

    async def subcounters(self, post_ids: Sequence[str]) -> list[int | Exception | None]:
        return await self.inner.subcounters(post_ids)

    async def bloom(self, user_id: str) -> bytes | None:
        return await self.inner.bloom(user_id)

    async def close(self) -> None:
        for task in list(self._fills):
            task.cancel()
        for c in self._clients.values():
            with contextlib.suppress(Exception):
                await c.aclose()
