"""The read path's tier logic, last-good cache and has_liked decisions, on in-memory stores that
implement services.read.core's protocols (no servers), with an injected clock."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from services.contracts import bloom
from services.read.breaker import CircuitBreaker
from services.read.core import (
    LAST_GOOD_MAX_AGE_S,
    Aggregate,
    CountView,
    LastGood,
    Reader,
    Totals,
)


class Clock:
    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class MemCache:
    """A count-cache in memory; `down` makes every call fail like a dead node."""

    def __init__(self) -> None:
        self.aggs: dict[str, Aggregate] = {}
        self.subs: dict[str, list[int | None]] = {}
        self.blooms: dict[str, bytes] = {}
        self.down = False
        self.dead_posts: set[str] = set()  # keys whose node is dead (per-key errors)
        self.delay_s = 0.0
        self.calls: list[str] = []

    async def _maybe_fail(self, what: str) -> None:
        self.calls.append(what)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.down:
            raise ConnectionError("count-cache down")

    async def aggregates(self, post_ids: Sequence[str]) -> list[Aggregate | Exception | None]:
        await self._maybe_fail("aggregates")
        return [
            ConnectionError("node down") if p in self.dead_posts else self.aggs.get(p)
            for p in post_ids
        ]

    async def subcounters(self, post_ids: Sequence[str]) -> list[int | Exception | None]:
        await self._maybe_fail("subcounters")
        out: list[int | Exception | None] = []
        for p in post_ids:
            vals = [v for v in self.subs.get(p, []) if v is not None]
            out.append(sum(vals) if vals else None)
        return out

    async def bloom(self, user_id: str) -> bytes | None:
        await self._maybe_fail("bloom")
        return self.blooms.get(user_id)


class MemStore:
    def __init__(self) -> None:
        self.cells: dict[str, list[tuple[int, dict[str, int]]]] = {}
        self.edges: dict[tuple[str, str], str] = {}
        self.down = False
        self.edge_queries = 0
        self.sum_queries = 0

    async def sums(self, post_ids: Sequence[str]) -> list[Totals | Exception]:
        self.sum_queries += 1
        if self.down:
            raise TimeoutError("cassandra down")
        out: list[Totals | Exception] = []
        for p in post_ids:
            count, reactions = 0, dict[str, int]()
            for value, rs in self.cells.get(p, []):
                count += value
                for r, n in rs.items():
                    reactions[r] = reactions.get(r, 0) + n
            out.append(Totals(count, reactions))
        return out

    async def edge_states(self, user_id: str, post_ids: Sequence[str]) -> dict[str, str]:
        self.edge_queries += 1
        if self.down:
            raise TimeoutError("cassandra down")
        return {p: self.edges[(user_id, p)] for p in post_ids if (user_id, p) in self.edges}


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def cache() -> MemCache:
    return MemCache()


@pytest.fixture
def store() -> MemStore:
    return MemStore()


@pytest.fixture
def reader(cache: MemCache, store: MemStore, clock: Clock) -> Reader:
    # breakers that never open, unless a test asks for one
    def never() -> CircuitBreaker:
        return CircuitBreaker("x", threshold=10**9)

    return Reader(
        cache,
        store,
        clock=clock,
        cache_timeout_s=0.05,
        store_timeout_s=0.05,
        cache_breaker=never(),
        store_breaker=never(),
        edge_breaker=never(),
    )


def ms(clock: Clock) -> int:
    return int(clock() * 1000)


# -- the tiers --------------------------------------------------------------------------------


async def test_aggregate_hit_answers_with_its_last_fresh(
    reader: Reader, cache: MemCache, store: MemStore
) -> None:
    cache.aggs["p"] = Aggregate(42, {"like": 40, "wow": 2}, last_fresh_ms=123, gen=7)
    (v,) = await reader.counts(["p"])
    assert (v.count, v.tier, v.stale, v.last_fresh_ms) == (42, "aggregate", False, 123)
    assert v.top_reactions() == [("like", 40), ("wow", 2)]
    assert cache.calls == ["aggregates"] and store.sum_queries == 0


async def test_aggregate_miss_sums_the_subcounters(
    reader: Reader, cache: MemCache, store: MemStore, clock: Clock
) -> None:
    cache.subs["p"] = [3, None, 4, None, None, None, None, 1]
    (v,) = await reader.counts(["p"])
    assert (v.count, v.tier, v.stale, v.last_fresh_ms) == (8, "subcounters", False, ms(clock))
    assert store.sum_queries == 0


async def test_both_cache_tiers_missing_sums_the_counter_store(
    reader: Reader, store: MemStore
) -> None:
    store.cells["p"] = [(5, {"like": 5}), (-1, {"like": -1}), (3, {"love": 3})]
    (v,) = await reader.counts(["p"])
    assert (v.count, v.tier, v.stale) == (7, "counter_store", False)
    assert v.top_reactions() == [("like", 4), ("love", 3)]


async def test_a_post_nobody_liked_is_zero_not_null(reader: Reader) -> None:
    (v,) = await reader.counts(["never-liked"])
    assert (v.count, v.tier, v.stale) == (0, "counter_store", False)


async def test_cache_down_falls_through_to_the_counter_store(
    reader: Reader, cache: MemCache, store: MemStore
) -> None:
    cache.down = True
    store.cells["p"] = [(9, {})]
    (v,) = await reader.counts(["p"])
    assert (v.count, v.tier) == (9, "counter_store")


async def test_a_dead_node_skips_the_subcounters_of_its_keys(
    reader: Reader, cache: MemCache, store: MemStore
) -> None:
    # the sub-counters share the aggregate's hash tag, so its slot and its dead node
    cache.dead_posts.add("p")
    cache.aggs["q"] = Aggregate(1, {})
    store.cells["p"] = [(2, {})]
    vp, vq = await reader.counts(["p", "q"])
    assert (vp.count, vp.tier) == (2, "counter_store")
    assert (vq.count, vq.tier) == (1, "aggregate")
    assert "subcounters" not in cache.calls


async def test_a_slow_cache_costs_its_deadline_then_falls_through(
    reader: Reader, cache: MemCache, store: MemStore
) -> None:
    cache.delay_s = 1.0  # far beyond the 50 ms deadline
    cache.aggs["p"] = Aggregate(1, {})
    store.cells["p"] = [(5, {})]
    (v,) = await asyncio.wait_for(reader.counts(["p"]), 0.5)
    assert (v.count, v.tier) == (5, "counter_store")


# -- the last good value ------------------------------------------------------------------------


async def test_everything_down_serves_the_last_good_value_stale(
    reader: Reader, cache: MemCache, store: MemStore, clock: Clock
) -> None:
    cache.aggs["p"] = Aggregate(10, {"like": 10}, last_fresh_ms=555)
    await reader.counts(["p"])
    cache.down = store.down = True
    clock.t += 30
    (v,) = await reader.counts(["p"])
    assert (v.count, v.stale, v.tier, v.last_fresh_ms) == (10, True, "last_good", 555)
    assert v.top_reactions() == [("like", 10)]


async def test_the_last_good_value_is_served_for_one_minute_at_most(
    reader: Reader, cache: MemCache, store: MemStore, clock: Clock
) -> None:
    store.cells["p"] = [(4, {})]
    await reader.counts(["p"])
    fresh_at = ms(clock)
    cache.down = store.down = True
    clock.t += LAST_GOOD_MAX_AGE_S  # exactly one minute: still served
    (v,) = await reader.counts(["p"])
    assert (v.count, v.stale, v.last_fresh_ms) == (4, True, fresh_at)
    clock.t += 0.001
    (v,) = await reader.counts(["p"])
    assert (v.count, v.stale, v.last_fresh_ms, v.tier) == (None, True, None, "none")


async def test_everything_down_without_a_last_good_value_is_null_and_stale(
    reader: Reader, cache: MemCache, store: MemStore
) -> None:
    cache.down = store.down = True
    (v,) = await reader.counts(["p"])
    assert (v.count, v.stale, v.last_fresh_ms) == (None, True, None)


async def test_a_fresh_answer_refreshes_the_last_good_value(
    reader: Reader, cache: MemCache, store: MemStore, clock: Clock
) -> None:
    cache.aggs["p"] = Aggregate(1, {}, last_fresh_ms=1)
    await reader.counts(["p"])
    clock.t += 50
    cache.aggs["p"] = Aggregate(2, {}, last_fresh_ms=2)
    await reader.counts(["p"])
    cache.down = store.down = True
    clock.t += 50  # 100 s after the first answer, 50 s after the second
    (v,) = await reader.counts(["p"])
    assert (v.count, v.stale, v.last_fresh_ms) == (2, True, 2)


def test_last_good_is_a_bounded_lru(clock: Clock) -> None:
    lg = LastGood(clock=clock, capacity=2)
    for p in ("a", "b", "c"):
        lg.put([CountView(p, 1, {}, 0, False, "aggregate")])
    assert len(lg) == 2 and lg.get("a") is None and lg.get("c") is not None


async def test_a_batch_keeps_request_order_and_reads_duplicates_once(
    reader: Reader, cache: MemCache, store: MemStore
) -> None:
    cache.aggs["a"] = Aggregate(1, {})
    cache.subs["b"] = [2]
    store.cells["c"] = [(3, {})]
    views = await reader.counts(["c", "a", "b", "a"])
    assert [(v.post_id, v.count, v.tier) for v in views] == [
        ("c", 3, "counter_store"),
        ("a", 1, "aggregate"),
        ("b", 2, "subcounters"),
        ("a", 1, "aggregate"),
    ]
    assert cache.calls == ["aggregates", "subcounters"] and store.sum_queries == 1


def test_degraded_uses_the_last_good_value_or_null(reader: Reader) -> None:
    reader.last_good.put([CountView("p", 3, {}, 9, False, "aggregate")])
    a, b = reader.degraded(["p", "q"])
    assert (a.count, a.stale, a.last_fresh_ms) == (3, True, 9)
    assert (b.count, b.stale) == (None, True)


# -- breakers -----------------------------------------------------------------------------------


async def test_an_open_breaker_stops_calling_a_dead_cache(
    cache: MemCache, store: MemStore, clock: Clock
) -> None:
    r = Reader(cache, store, clock=clock, cache_breaker=CircuitBreaker("c", threshold=2))
    cache.down = True
    for _ in range(5):
        (v,) = await r.counts(["p"])
        assert v.tier == "counter_store"
    assert cache.calls == ["aggregates", "aggregates"]


async def test_a_breaker_no_read_reaches_closes_once_its_store_is_back(
    cache: MemCache, store: MemStore, clock: Clock
) -> None:
    """The counter-store is down while the count-cache misses: its breaker opens. The cache then
    answers every read, so no read reaches the store again: the trial must still close it (and
    the gauge with it), or ReadBreakerOpen would fire on a healthy store."""
    r = Reader(
        cache,
        store,
        clock=clock,
        store_breaker=CircuitBreaker("counter-store", threshold=1, clock=clock),
    )
    store.down = True
    (v,) = await r.counts(["p"])
    assert v.tier == "none"
    assert r.store_breaker.state == "open"
    cache.aggs["p"] = Aggregate(3, {}, ms(clock))
    store.down = False
    clock.t += r.store_breaker.cooldown_s
    (v,) = await r.counts(["p"])
    assert (v.tier, store.sum_queries) == ("aggregate", 1)  # no read went on to the store
    assert r.store_breaker.state == "half_open"
    await r.probe_open_breakers()
    assert (r.store_breaker.state, store.sum_queries) == ("closed", 2)
    assert r._shown["counter-store"] == 0


async def test_a_breaker_trial_on_a_store_still_down_keeps_it_open(
    cache: MemCache, store: MemStore, clock: Clock
) -> None:
    r = Reader(
        cache,
        store,
        clock=clock,
        edge_breaker=CircuitBreaker("edge-store", threshold=1, clock=clock),
    )
    cache.blooms["u"] = user_filter("a")
    store.down = True
    assert await r.has_liked("u", ["a"]) == [None]
    await r.probe_open_breakers()  # cooldown not over: no trial
    assert (r.edge_breaker.state, store.edge_queries) == ("open", 1)
    clock.t += r.edge_breaker.cooldown_s
    await r.probe_open_breakers()
    assert (r.edge_breaker.state, store.edge_queries) == ("open", 2)
    assert r._shown["edge-store"] == 1
    store.down = False
    clock.t += r.edge_breaker.cooldown_s
    await r.probe_open_breakers()
    assert (r.edge_breaker.state, r._shown["edge-store"]) == ("closed", 0)
    assert await r.has_liked("u", ["a"]) == [False]  # the edge was never written


# -- has_liked --------------------------------------------------------------------------------


def user_filter(*post_ids: str) -> bytes:
    return bloom.build(post_ids)


async def test_bloom_no_answers_without_the_edge_store(
    reader: Reader, cache: MemCache, store: MemStore
) -> None:
    cache.blooms["u"] = user_filter("liked-post")
    store.down = True  # it must not matter
    assert await reader.has_liked("u", ["other-post"]) == [False]
    assert store.edge_queries == 0


async def test_bloom_maybe_is_confirmed_by_one_edge_query_for_the_page(
    reader: Reader, cache: MemCache, store: MemStore
) -> None:
    cache.blooms["u"] = user_filter("a", "b", "c")
    store.edges[("u", "a")] = "liked"
    store.edges[("u", "b")] = "unliked"  # liked then unliked: the filter cannot forget
    assert await reader.has_liked("u", ["a", "b", "c", "d"]) == [True, False, False, False]
    assert store.edge_queries == 1


async def test_a_missing_filter_means_maybe_and_asks_for_a_rebuild(
    cache: MemCache, store: MemStore
) -> None:
    asked: list[str] = []
    reader = Reader(cache, store, rebuild_filter=asked.append)
    store.edges[("u", "a")] = "liked"
    assert await reader.has_liked("u", ["a", "b"]) == [True, False]
    assert store.edge_queries == 1
    assert asked == ["u"]
    cache.blooms["u"] = user_filter("a")
    assert await reader.has_liked("u", ["a", "b"]) == [True, False]
    assert asked == ["u"]  # a filter (or a marker) is there: nothing more to build


async def test_a_failing_cache_asks_for_no_rebuild(cache: MemCache, store: MemStore) -> None:
    asked: list[str] = []
    reader = Reader(cache, store, rebuild_filter=asked.append)
    cache.down = True
    await reader.has_liked("u", ["a"])
    assert asked == []  # "no answer" is not "no filter": a rebuild would race a live filter


async def test_cache_down_means_maybe_for_everything(
    reader: Reader, cache: MemCache, store: MemStore
) -> None:
    cache.down = True
    store.edges[("u", "a")] = "liked"
    assert await reader.has_liked("u", ["a", "b"]) == [True, False]


async def test_an_unconfirmable_maybe_is_null_but_a_no_is_still_false(
    reader: Reader, cache: MemCache, store: MemStore
) -> None:
    cache.blooms["u"] = user_filter("a")
    store.down = True
    assert await reader.has_liked("u", ["a", "b"]) == [None, False]


async def test_a_foreign_or_corrupt_filter_is_ignored(
    reader: Reader, cache: MemCache, store: MemStore
) -> None:
    cache.blooms["u"] = b"\x06" + b"\x00" * 40  # wrong size: not ours
    store.edges[("u", "a")] = "liked"
    assert await reader.has_liked("u", ["a"]) == [True]
