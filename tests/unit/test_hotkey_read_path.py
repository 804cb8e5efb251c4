"""The read path's part in the hot-key loop, without servers: the hot-pool cache's routing, its
fall-back to the count-cache and its Redis AUTH. (Reads reach the sampler as the gateway's
mirrored copies, not from the read service: see test_hotkey_sampler.py.)

The unreachable hot pool is a real Redis client on a port nothing listens on (no Redis mock)."""

from __future__ import annotations

import socket
from collections.abc import Sequence

from prometheus_client import REGISTRY

from services.contracts import hotkeys
from services.read.core import Aggregate, Reader
from services.read.hotkeys import HotPoolCountCache, LocalHeat


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


# -- HotPoolCountCache --------------------------------------------------------------------------
def dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Inner:
    """The count-cache behind the hot pools: fixed aggregates, records what it was asked."""

    def __init__(self, counts: dict[str, int]) -> None:
        self.counts = counts
        self.asked: list[list[str]] = []

    async def aggregates(self, post_ids: Sequence[str]) -> list[Aggregate | Exception | None]:
        self.asked.append(list(post_ids))
        return [Aggregate(self.counts[p], {}) if p in self.counts else None for p in post_ids]

    async def subcounters(self, post_ids: Sequence[str]) -> list[int | Exception | None]:
        return [None for _ in post_ids]

    async def bloom(self, user_id: str) -> bytes | None:
        return b"bloom:" + user_id.encode()


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def view(pools: dict[str, list[str]], clock: Clock) -> hotkeys.PrefixView[list[str]]:
    v: hotkeys.PrefixView[list[str]] = hotkeys.PrefixView(
        "127.0.0.1", 1, hotkeys.HOTPOOL_PREFIX, hotkeys.decode_pools, clock=clock
    )
    v.last_good.ok(pools)  # what a successful poll of /likes/hotpool/ stores
    return v


async def test_cold_posts_never_touch_a_hot_pool() -> None:
    inner = Inner({"a": 1, "b": 2})
    cache = HotPoolCountCache(inner, view({}, Clock()))
    got = await cache.aggregates(["a", "b", "c"])
    assert got == [Aggregate(1, {}), Aggregate(2, {}), None]
    assert inner.asked == [["a", "b", "c"]]
    assert cache._clients == {}
    await cache.close()


async def test_an_unreachable_hot_pool_falls_back_to_the_count_cache_in_order() -> None:
    dead = f"127.0.0.1:{dead_port()}"
    inner = Inner({"a": 1, "hot": 40, "b": 2})
    cache = HotPoolCountCache(inner, view({"hot": [dead]}, Clock()), timeout_s=0.5)
    errors = metric("likes_read_hot_pool_total", result="error")
    got = await cache.aggregates(["a", "hot", "b"])
    assert [g.count for g in got if isinstance(g, Aggregate)] == [1, 40, 2]
    assert inner.asked == [["a", "hot", "b"]]  # the hot post too, after its replica failed
    assert metric("likes_read_hot_pool_total", result="error") - errors == 1
    await cache.close()


async def test_an_expired_hot_pool_view_reads_everything_from_the_count_cache() -> None:
    clock = Clock()
    dead = f"127.0.0.1:{dead_port()}"
    inner = Inner({"hot": 40})
    cache = HotPoolCountCache(inner, view({"hot": [dead]}, clock))
    clock.t += hotkeys.GRACE_S + 1  # etcd unreachable for longer than the grace period
    errors = metric("likes_read_hot_pool_total", result="error")
    assert await cache.aggregates(["hot"]) == [Aggregate(40, {})]
    assert metric("likes_read_hot_pool_total", result="error") == errors  # no replica tried
    await cache.close()


async def test_subcounters_and_bloom_go_to_the_count_cache() -> None:
    inner = Inner({})
    cache = HotPoolCountCache(inner, view({"hot": ["127.0.0.1:1"]}, Clock()))
    assert await cache.subcounters(["hot"]) == [None]
    assert await cache.bloom("u1") == b"bloom:u1"
    await cache.close()


class NoStore:
    """The counter/edge store; never reached when the count-cache answers."""

    async def sums(self, post_ids: Sequence[str]) -> list[object]:
        raise AssertionError("the counter-store should not be asked")

    async def edge_states(self, user_id: str, post_ids: Sequence[str]) -> dict[str, str]:
        raise AssertionError("the edge-store should not be asked")


async def test_a_down_hot_pool_does_not_push_the_batch_off_the_aggregate_tier() -> None:
    # one attempt, no client retries: redis-py's default (10, with backoff) outlasts the Reader's
    # count-cache deadline, and the whole batch, cold posts too, would miss the aggregate tier
    dead = f"127.0.0.1:{dead_port()}"
    inner = Inner({"cold": 3, "hot": 40})
    cache = HotPoolCountCache(inner, view({"hot": [dead]}, Clock()))
    reader = Reader(cache, NoStore())  # type: ignore[arg-type]
    views = await reader.counts(["cold", "hot"])
    assert [(v.count, v.tier, v.stale) for v in views] == [
        (3, "aggregate", False),
        (40, "aggregate", False),
    ]
    assert cache._client(dead).get_retry()._retries == 0  # type: ignore[union-attr]
    await cache.close()


async def test_hot_pool_clients_authenticate_with_the_redis_password() -> None:
    # the hot pools run with requirepass (infra/redis.py): a client without it reads nothing
    cache = HotPoolCountCache(Inner({}), view({}, Clock()), password="s3cret")
    kwargs = cache._client("127.0.0.1:1").connection_pool.connection_kwargs
    assert kwargs["password"] == "s3cret"
    await cache.close()


# -- LocalHeat: a pod's own reads promote a post before any flag (always-replicate) -------------
def test_local_heat_promotes_a_post_by_the_previous_seconds_reads_only() -> None:
    clock = Clock()
    heat = LocalHeat(threshold=3, clock=clock)
    assert [heat.hit("p") for _ in range(5)] == [False] * 5  # no previous second yet
    clock.t = 1.2
    assert heat.hit("p") is True  # 5 reads last second >= 3
    assert heat.hit("q") is False  # other posts are not promoted with it
    clock.t = 2.5  # second 1 saw 1 read of p: below the threshold again
    assert heat.hit("p") is False
    for _ in range(3):
        heat.hit("p")
    clock.t = 4.0  # a skipped second forgets everything: no stale promotion
    assert heat.hit("p") is False


async def test_a_locally_hot_post_reads_a_hot_pool_without_any_flag() -> None:
    clock = Clock()
    inner = Inner({"hot": 5, "cold": 7})
    dead = f"127.0.0.1:{dead_port()}"
    cache = HotPoolCountCache(
        inner,
        view({}, clock),  # the operator has flagged nothing
        timeout_s=0.5,
        pools=[dead],
        local_heat=LocalHeat(threshold=2, clock=clock),
    )
    await cache.aggregates(["hot", "hot", "cold"])
    assert inner.asked == [["hot", "hot", "cold"]]
    errors = metric("likes_read_hot_pool_total", result="error")
    promoted = metric("likes_read_locally_hot_total")
    clock.t = 1.0
    got = await cache.aggregates(["hot", "cold"])
    # "hot" was read twice last second: it went to the pool (dead here: one error) and fell back
    assert metric("likes_read_hot_pool_total", result="error") == errors + 1
    assert metric("likes_read_locally_hot_total") == promoted + 1
    assert [a.count for a in got if isinstance(a, Aggregate)] == [5, 7]
    # without pool addresses, local heat routes nothing (only the operator's flags do)
    bare = HotPoolCountCache(
        inner, view({}, clock), pools=[], local_heat=LocalHeat(threshold=1, clock=clock)
    )
    await bare.aggregates(["hot"])
    clock.t = 2.0
    await bare.aggregates(["hot"])
    assert metric("likes_read_hot_pool_total", result="error") == errors + 1
    await cache.close()
    await bare.close()
