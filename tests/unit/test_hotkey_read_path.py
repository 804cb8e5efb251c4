"""The read path's part in the hot-key loop, without servers: the sample mirror's bounded buffer,
fraction sampling and batches; the hot-pool cache's routing and its fall-back to the count-cache.

The sampler is an httpx transport that records the batches; the unreachable hot pool is a real
Redis client on a port nothing listens on (no Redis mock)."""

from __future__ import annotations

import json
import random
import socket
from collections.abc import Sequence

import httpx
from prometheus_client import REGISTRY

from services.contracts import hotkeys
from services.read.core import Aggregate, Reader
from services.read.hotkeys import HotPoolCountCache, MirrorSettings, SampleMirror


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


# -- SampleMirror -------------------------------------------------------------------------------
class Sampler:
    """Records the mirror's POSTs; answers `status`."""

    def __init__(self, status: int = 202) -> None:
        self.status = status
        self.batches: list[dict[str, object]] = []
        self.urls: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.urls.append(str(request.url))
        self.batches.append(json.loads(request.content))
        return httpx.Response(self.status, json={"accepted": 0})


def mirror_to(sampler: Sampler, **kw: object) -> SampleMirror:
    m = SampleMirror("http://sampler:8700/", **kw)  # type: ignore[arg-type]
    m._http = httpx.AsyncClient(transport=httpx.MockTransport(sampler))
    return m


def test_defaults_are_a_one_percent_mirror_and_off_without_a_sampler() -> None:
    cfg = MirrorSettings()
    assert cfg.sample_fraction == 0.01
    assert SampleMirror("http://s").fraction == 0.01
    assert MirrorSettings(_env_file=None, sampler_url=None).sampler_url is None  # type: ignore[call-arg]


def test_fraction_sampling_follows_the_seeded_rng() -> None:
    ids = [f"p{i}" for i in range(100_000)]
    m = SampleMirror("http://s", 0.01, capacity=1_000_000, rng=random.Random(7))
    m.offer(ids)
    expect_rng = random.Random(7)
    expected = [p for p in ids if expect_rng.random() < 0.01]
    assert list(m.buffer) == expected  # exactly the ids the seeded draws pick, in order
    assert 800 <= len(expected) <= 1200  # ~1%


def test_fraction_one_mirrors_everything_and_zero_nothing() -> None:
    everything = SampleMirror("http://s", 1.0, rng=random.Random(1))
    everything.offer(["a", "b", "a"])
    assert list(everything.buffer) == ["a", "b", "a"]  # repeats are samples too
    nothing = SampleMirror("http://s", 0.0, rng=random.Random(1))
    nothing.offer([f"p{i}" for i in range(10_000)])
    assert not nothing.buffer


def test_a_full_buffer_drops_the_oldest_samples() -> None:
    m = SampleMirror("http://s", 1.0, capacity=5)
    m.offer([f"p{i}" for i in range(12)])
    assert list(m.buffer) == ["p7", "p8", "p9", "p10", "p11"]


async def test_flush_posts_everything_buffered_as_one_batch_and_empties_the_buffer() -> None:
    sampler = Sampler()
    m = mirror_to(sampler, fraction=1.0, capacity=100)
    sent = metric("likes_read_mirrored_total", result="sent")
    m.offer(["a", "b"])
    m.offer(["c"])
    assert await m.flush() == 3
    assert sampler.urls == ["http://sampler:8700/v1/samples"]
    assert sampler.batches == [{"post_ids": ["a", "b", "c"], "fraction": 1.0}]
    assert not m.buffer
    assert metric("likes_read_mirrored_total", result="sent") - sent == 3
    assert await m.flush() == 0  # nothing buffered: no request
    assert len(sampler.batches) == 1
    await m.close()


async def test_a_batch_carries_the_fraction_so_the_sampler_can_scale() -> None:
    sampler = Sampler()
    m = mirror_to(sampler, fraction=0.5, rng=random.Random(3))
    m.offer([f"p{i}" for i in range(100)])
    await m.flush()
    assert sampler.batches[0]["fraction"] == 0.5
    rng = random.Random(3)
    assert sampler.batches[0]["post_ids"] == [f"p{i}" for i in range(100) if rng.random() < 0.5]
    await m.close()


async def test_a_failing_sampler_loses_the_batch_not_the_next_one() -> None:
    sampler = Sampler(status=503)
    m = mirror_to(sampler, fraction=1.0)
    dropped = metric("likes_read_mirrored_total", result="dropped")
    m.offer(["a", "b"])
    assert await m.flush() == 2  # no exception reaches the caller
    assert not m.buffer  # samples are disposable: not retried, not piling up
    assert metric("likes_read_mirrored_total", result="dropped") - dropped == 2
    sampler.status = 202
    m.offer(["c"])
    await m.flush()
    assert sampler.batches[-1]["post_ids"] == ["c"]
    await m.close()


async def test_an_unreachable_sampler_drops_the_batch() -> None:
    m = SampleMirror(f"http://127.0.0.1:{dead_port()}", 1.0)
    dropped = metric("likes_read_mirrored_total", result="dropped")
    m.offer(["a"])
    assert await m.flush() == 1
    assert metric("likes_read_mirrored_total", result="dropped") - dropped == 1
    await m.close()


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
