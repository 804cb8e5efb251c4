"""The read path's decisions, free of servers: the count tiers, the last-good cache, has_liked.

Counts fall through, per post:
  aggregate `count:{p}` (HMGET of the fields read) → sub-counters (one MGET, a hit when any is
  set) → counter-store SUM over the post's cells → the last good answer if at most 1 minute old
  (`stale: true`, its `last_fresh`) → `count: null, stale: true`.
Nothing is written back to counts: the aggregator owns them. has_liked: the user's Bloom filter
says "no" without the edge-store; a "maybe" (or a missing/unreadable filter) is confirmed by one
single-partition edge-store read for the whole page, and a missing filter is rebuilt in the
background (`rebuild_filter`, services/read/stores.py FilterRebuilder).

Stores are reached through the `CountCache` / `EdgeAndCounterStore` protocols (services/read/
stores.py has the Redis and Cassandra ones); every call has a deadline and a circuit breaker.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, TypeVar

from services.contracts import bloom
from services.read.breaker import CircuitBreaker
from services.read.metrics import BREAKER_OPEN, DEPENDENCY_ERRORS, HAS_LIKED, TIER, Children

log = logging.getLogger("read")

Tier = Literal["aggregate", "subcounters", "counter_store", "last_good", "none"]
LAST_GOOD_MAX_AGE_S = 60.0
TOP_REACTIONS = 3


# Aggregate, Totals and CountView are values, never changed once made, but not frozen: a frozen
# dataclass builds three times slower (object.__setattr__ per field, 1.5 against 0.5 µs), and a
# batch read builds a hundred of them.


@dataclass(slots=True)
class Aggregate:
    """The aggregator's `count:{p}` hash."""

    count: int
    reactions: dict[str, int]
    last_fresh_ms: int | None = None
    gen: int | None = None


@dataclass(slots=True)
class Totals:
    """The counter-store's SUM over a post's cells."""

    count: int
    reactions: dict[str, int]


@dataclass(slots=True)
class CountView:
    post_id: str
    count: int | None
    reactions: dict[str, int]
    last_fresh_ms: int | None
    stale: bool
    tier: Tier

    def top_reactions(self, n: int = TOP_REACTIONS) -> list[tuple[str, int]]:
        ranked = sorted(
            ((r, c) for r, c in self.reactions.items() if c > 0), key=lambda rc: (-rc[1], rc[0])
        )
        return ranked[:n]


class Unavailable(Exception):
    """A dependency was not called (breaker open) or did not answer in time."""


class CountCache(Protocol):
    async def aggregates(self, post_ids: Sequence[str]) -> list[Aggregate | Exception | None]:
        """Per post: the aggregate, None on a miss, or the exception of that key's node."""
        ...

    async def subcounters(self, post_ids: Sequence[str]) -> list[int | Exception | None]:
        """Per post: the sum of the sub-counters, None when none is set, or an exception."""
        ...

    async def bloom(self, user_id: str) -> bytes | None: ...


class Store(Protocol):
    async def sums(self, post_ids: Sequence[str]) -> list[Totals | Exception]:
        """Per post: the SUM over its counter cells (0 when it has none), or an exception."""
        ...

    async def edge_states(self, user_id: str, post_ids: Sequence[str]) -> dict[str, str]:
        """post_id → edge state ('liked'/'unliked') for the user's edges among post_ids."""
        ...


@dataclass
class _Entry:
    view: CountView
    stored_at: float


@dataclass
class LastGood:
    """The last fresh answer per post, served only while at most `max_age_s` old (bounded LRU)."""

    clock: Callable[[], float] = time.time
    max_age_s: float = LAST_GOOD_MAX_AGE_S
    capacity: int = 100_000
    _entries: OrderedDict[str, _Entry] = field(default_factory=OrderedDict)

    def put(self, views: Sequence[CountView]) -> None:
        """Remember fresh answers (once per post read: kept lean, one clock read per call)."""
        entries, now = self._entries, self.clock()
        for view in views:
            entries[view.post_id] = _Entry(view, now)
            entries.move_to_end(view.post_id)
        while len(entries) > self.capacity:
            entries.popitem(last=False)

    def get(self, post_id: str) -> CountView | None:
        """The stale answer for post_id, or None when there is none young enough."""
        entry = self._entries.get(post_id)
        if entry is None:
            return None
        # the bound is on when *we* last saw it fresh, not on the aggregator's last_fresh: a
        # cold post's aggregate may be hours old and still exact
        if self.clock() - entry.stored_at > self.max_age_s:
            del self._entries[post_id]
            return None
        v = entry.view
        return CountView(v.post_id, v.count, v.reactions, v.last_fresh_ms, True, "last_good")

    def __len__(self) -> int:
        return len(self._entries)


T = TypeVar("T")

# Label children bound once: `.labels(...)` hashes and locks on every call, several times a read
_TIER = Children(TIER)
_HAS_LIKED = Children(HAS_LIKED)
_DEPENDENCY_ERRORS = Children(DEPENDENCY_ERRORS)
_BREAKER_OPEN = Children(BREAKER_OPEN)


class Reader:
    def __init__(
        self,
        cache: CountCache,
        store: Store,
        *,
        clock: Callable[[], float] = time.time,
        cache_timeout_s: float = 0.5,
        store_timeout_s: float = 1.0,
        last_good: LastGood | None = None,
        cache_breaker: CircuitBreaker | None = None,
        store_breaker: CircuitBreaker | None = None,
        edge_breaker: CircuitBreaker | None = None,
        rebuild_filter: Callable[[str], None] | None = None,
    ) -> None:
        self.cache = cache
        self.rebuild_filter = rebuild_filter
        self.store = store
        self.clock = clock
        self.cache_timeout_s = cache_timeout_s
        self.store_timeout_s = store_timeout_s
        self.last_good = last_good or LastGood(clock=clock)
        self.cache_breaker = cache_breaker or CircuitBreaker("count-cache", cooldown_s=1.0)
        self.store_breaker = store_breaker or CircuitBreaker("counter-store", cooldown_s=3.0)
        self.edge_breaker = edge_breaker or CircuitBreaker("edge-store", cooldown_s=3.0)
        self._shown: dict[str, int] = {}
        # every dependency's series from the start, at 0: a panel or a rate() over them has
        # data before the first failure (Prometheus's advice for labels known in advance)
        for breaker in (self.cache_breaker, self.store_breaker, self.edge_breaker):
            _DEPENDENCY_ERRORS[breaker.name]
            self._show(breaker)

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    async def _call(
        self, breaker: CircuitBreaker, timeout_s: float, fn: Callable[[], Awaitable[T]]
    ) -> T:
        """One guarded call: refused while the breaker is open, bounded by the deadline."""
        if not breaker.allow():
            _DEPENDENCY_ERRORS[breaker.name].inc()
            raise Unavailable(f"{breaker.name}: circuit open")
        try:
            # asyncio.timeout, not wait_for: the call runs in this task, not in a new task per
            # dependency call (same deadline, same TimeoutError, less work per read)
            async with asyncio.timeout(timeout_s):
                result = await fn()
        except Exception:
            breaker.failure()
            _DEPENDENCY_ERRORS[breaker.name].inc()
            self._show(breaker)
            raise
        return result

    def _settle(self, breaker: CircuitBreaker, results: Sequence[object]) -> None:
        """Per-key results: the dependency is up if any key answered."""
        errors = sum(isinstance(r, Exception) for r in results)
        if results and errors == len(results):
            breaker.failure()
        else:
            breaker.success()
        if errors:
            _DEPENDENCY_ERRORS[breaker.name].inc(errors)
        self._show(breaker)

    async def probe_open_breakers(self) -> None:
        """Give each breaker whose cooldown is over its trial call, whether or not a read needs
        the dependency. A read tries a breaker only when it reaches that tier: once the
        count-cache answers again no read goes on to the counter-store, so without this its
        breaker (and likes_read_breaker_open, and ReadBreakerOpen) would stay open long after
        the store came back (the edge-store-quorum-loss game day found it). The trials are the
        reads' own calls on a key nobody writes; the read service runs this every second."""
        probe = "__breaker_probe__"
        if self.cache_breaker.state == "half_open":
            await self._guarded_batch(
                self.cache_breaker, self.cache_timeout_s, lambda: self.cache.aggregates([probe]), 1
            )
        if self.store_breaker.state == "half_open":
            await self._guarded_batch(
                self.store_breaker, self.store_timeout_s, lambda: self.store.sums([probe]), 1
            )
        if self.edge_breaker.state == "half_open":
            try:
                await self._call(
                    self.edge_breaker,
                    self.store_timeout_s,
                    lambda: self.store.edge_states(probe, [probe]),
                )
            except Exception:  # _call counted it and reopened the breaker
                return
            self._succeeded(self.edge_breaker)

    def _succeeded(self, breaker: CircuitBreaker) -> None:
        breaker.success()
        self._show(breaker)

    def _show(self, breaker: CircuitBreaker) -> None:
        """likes_read_breaker_open, set when it changes (a gauge's set() locks: once a read)."""
        is_open = 0 if breaker.opened_at is None else 1  # open or half-open
        if self._shown.get(breaker.name) != is_open:
            _BREAKER_OPEN[breaker.name].set(is_open)
            self._shown[breaker.name] = is_open

    async def _guarded_batch(
        self,
        breaker: CircuitBreaker,
        timeout_s: float,
        fn: Callable[[], Awaitable[list[T | Exception]]],
        n: int,
    ) -> list[T | Exception]:
        try:
            results = await self._call(breaker, timeout_s, fn)
        except Exception as e:
            if not isinstance(e, Unavailable):
                fields = {"dependency": breaker.name, "error": repr(e)}
                log.warning("dependency failed", extra={"fields": fields})
            return [e] * n
        self._settle(breaker, results)
        return results

    # -- counts ---------------------------------------------------------------------------------
    async def counts(self, post_ids: Sequence[str]) -> list[CountView]:
        ids = list(dict.fromkeys(post_ids))  # a feed page may repeat a post: read it once
        views: dict[str, CountView] = {}
        now_ms = self._now_ms()

        aggs = await self._guarded_batch(
            self.cache_breaker, self.cache_timeout_s, lambda: self.cache.aggregates(ids), len(ids)
        )
        cache_down: set[str] = set()
        missed: list[str] = []
        for p, a in zip(ids, aggs, strict=True):
            if isinstance(a, Aggregate):
                fresh = a.last_fresh_ms if a.last_fresh_ms is not None else now_ms
                views[p] = CountView(p, a.count, a.reactions, fresh, False, "aggregate")
            elif isinstance(a, Exception):
                cache_down.add(p)  # the sub-counters share the slot (hash tag): same dead node
            else:
                missed.append(p)

        if missed:
            subs = await self._guarded_batch(
                self.cache_breaker,
                self.cache_timeout_s,
                lambda: self.cache.subcounters(missed),
                len(missed),
            )
            for p, s in zip(missed, subs, strict=True):
                if isinstance(s, int):
                    views[p] = CountView(p, s, {}, now_ms, False, "subcounters")

        rest = [p for p in ids if p not in views]
        if rest:
            sums = await self._guarded_batch(
                self.store_breaker, self.store_timeout_s, lambda: self.store.sums(rest), len(rest)
            )
            for p, t in zip(rest, sums, strict=True):
                if isinstance(t, Totals):
                    views[p] = CountView(p, t.count, t.reactions, now_ms, False, "counter_store")

        self.last_good.put(list(views.values()))
        tiers: dict[str, int] = {}
        for p in ids:
            v = views.get(p)
            if v is None:
                v = views[p] = self.last_good.get(p) or CountView(p, None, {}, None, True, "none")
            tiers[v.tier] = tiers.get(v.tier, 0) + 1
        for tier, n in tiers.items():
            _TIER[tier].inc(n)
        return [views[p] for p in post_ids]

    def degraded(self, post_ids: Sequence[str]) -> list[CountView]:
        """The answer when something unexpected broke: last good or null, never an error."""
        return [
            self.last_good.get(p) or CountView(p, None, {}, None, True, "none") for p in post_ids
        ]

    # -- has_liked ------------------------------------------------------------------------------
    async def has_liked(self, user_id: str, post_ids: Sequence[str]) -> list[bool | None]:
        """Per post: True/False, or None when a "maybe" could not be confirmed."""
        ids = list(dict.fromkeys(post_ids))
        try:
            raw = await self._call(
                self.cache_breaker, self.cache_timeout_s, lambda: self.cache.bloom(user_id)
            )
            self._succeeded(self.cache_breaker)
            if raw is None and self.rebuild_filter is not None:
                self.rebuild_filter(user_id)  # a miss: built in the background, used next time
        except Exception:
            raw = None  # no filter to consult: everything is a "maybe"
        f = bloom.load(raw)
        answers: dict[str, bool | None] = {}
        maybes: list[str] = []
        for p in ids:
            if bloom.contains(f, p):
                maybes.append(p)
            else:
                answers[p] = False
        if len(answers):
            _HAS_LIKED["no"].inc(len(answers))
        if maybes:
            _HAS_LIKED["maybe"].inc(len(maybes))
            try:
                states = await self._call(
                    self.edge_breaker,
                    self.store_timeout_s,
                    lambda: self.store.edge_states(user_id, maybes),
                )
                self._succeeded(self.edge_breaker)
            except Exception as e:
                if not isinstance(e, Unavailable):
                    log.warning("edge-store lookup failed", extra={"fields": {"error": repr(e)}})
                _HAS_LIKED["unavailable"].inc(len(maybes))
                states = None
            if states is not None:
                for p in maybes:
                    liked = states.get(p) == "liked"
                    answers[p] = liked
                    _HAS_LIKED["confirmed" if liked else "false_positive"].inc()
            else:
                for p in maybes:
                    answers[p] = None
        return [answers[p] for p in post_ids]
