"""The aggregator against a count-cache that is full or refusing writes (issue 10, hole 2).

A 32 MB one-node Redis Cluster of our own (the program's eviction policy, the stack's password)
plays the count-cache; Kafka, the registry and Cassandra are the stack's. Before the fix, one run
of ~150 k distinct likers filled the stack's count-cache with filters that could not be evicted,
every aggregate write failed OOM, and the aggregator retried one window forever: counts froze.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import redis
from cassandra.cluster import Session
from confluent_kafka import Consumer, Producer, TopicPartition
from prometheus_client import REGISTRY

from local.components.redis import ScratchCluster
from services.aggregator import cache
from services.aggregator.settings import AggregatorSettings
from services.contracts import bloom, clients, keys
from services.read.core import Reader
from services.read.stores import CassandraStore, RedisCountCache
from tests.conftest import Stack
from tests.integration.test_aggregator import (  # fixtures and helpers, no tests
    base_settings,
    env,
    like,
    msg,
    produce,
    producer,
    running,
    serialize,
    session,
    settings,
    wait_for,
)

pytestmark = pytest.mark.stack
__all__ = ["base_settings", "env", "producer", "serialize", "session", "settings"]

MAXMEMORY_MB = 32
LIKERS = 100_000
POSTS = 500


@pytest.fixture(scope="module")
def small(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScratchCluster]:
    home = tmp_path_factory.mktemp("small-count-cache")
    c = ScratchCluster(home, stack.redis_password, MAXMEMORY_MB)
    yield c
    c.close()


@pytest.fixture
def on_small(settings: AggregatorSettings, small: ScratchCluster) -> AggregatorSettings:
    return settings.model_copy(
        update={"count_cache_nodes": f"127.0.0.1:{small.port}", "cdn_purger": "none"}
    )


def cache_faults() -> float:
    return sum(
        REGISTRY.get_sample_value("likes_aggregator_cache_faults_total", {"what": w}) or 0.0
        for w in ("aggregate", "bloom")
    )


def caught_up(s: AggregatorSettings) -> bool:
    """The group's committed offsets are at the end of every source partition."""
    c = Consumer({**clients.kafka_config(s), "group.id": s.agg_group_id})
    try:
        for topic in s.source_topics:
            parts = [
                TopicPartition(topic, p)
                for p in c.list_topics(topic, timeout=10).topics[topic].partitions
            ]
            for tp in c.committed(parts, timeout=10):
                _lo, hi = c.get_watermark_offsets(tp, timeout=10)
                if tp.offset < hi:
                    return False
        return True
    finally:
        c.close()


def cell_sums(session: Session, posts: list[str]) -> dict[str, int]:
    q = session.prepare("SELECT value FROM counter_cells WHERE post_id = ?")
    return {p: sum(r.value for r in session.execute(q, (p,))) for p in posts}


def seed_edge(session: Session, user: str, post: str) -> None:
    session.execute(
        "INSERT INTO edges (user_id, kind, ref, state, reaction, void, updated_at) "
        "VALUES (%s, 'edge', %s, 'liked', 'like', false, %s)",
        (user, post, datetime.now(UTC)),
    )


def fill_with_filters(small: ScratchCluster, users: list[str], capacity: int) -> None:
    value = bloom.build([], capacity=capacity)
    pipe = small.r.pipeline(transaction=False)
    for u in users:
        pipe.set(keys.bloom_key(u), value, ex=bloom.FILTER_TTL_S)
    pipe.execute()


async def read_back(
    s: AggregatorSettings, truth: dict[str, int], liked: list[tuple[str, str]]
) -> tuple[dict[str, int | None], list[bool | None], list[bool | None]]:
    """Counts and has_liked as the read service answers them from the small cache."""
    cache_, store = RedisCountCache(s, timeout_s=2.0), CassandraStore(s, timeout_s=10.0)
    try:
        await asyncio.to_thread(store._connect)
        reader = Reader(cache_, store, cache_timeout_s=2.0, store_timeout_s=10.0)
        views = await reader.counts(list(truth))
        yes = [(await reader.has_liked(u, [p]))[0] for u, p in liked]
        no = [(await reader.has_liked(u, ["never-liked-" + p]))[0] for u, p in liked]
        return {v.post_id: v.count for v in views}, yes, no
    finally:
        await store.close()
        await cache_.close()


def test_100k_distinct_likers_through_a_full_32mb_cache_lose_no_count(
    on_small: AggregatorSettings, small: ScratchCluster, producer: Producer, serialize: Any,
    session: Session,
) -> None:  # fmt: skip
    rng = random.Random(7)
    run = uuid.uuid4().hex[:8]
    posts = [f"mem-{run}-{i}" for i in range(POSTS)]
    weights = [1 / (i + 1) ** 1.1 for i in range(POSTS)]
    events = [like(p) for p in rng.choices(posts, weights, k=LIKERS)]
    truth = Counter(e.post_id for e in events)

    # the cache starts full of other users' filters (40 MB of them into 32 MB: evicting already)
    fill_with_filters(small, [f"other-{run}-{i}" for i in range(30_000)], capacity=1024)
    # and some of these likers already have a filter, which the aggregator must keep complete
    with_filter = events[-1000:]
    fill_with_filters(small, [e.user_id for e in with_filter], capacity=32)
    evicted_before = int(small.r.info("stats")["evicted_keys"])
    assert evicted_before > 0, "the cache was never under memory pressure"
    faults = cache_faults()

    produce(producer, [msg(serialize, e) for e in events])
    with running(on_small):
        wait_for(lambda: caught_up(on_small), timeout=240, what="the aggregator to catch up")

    assert small.oom_errors() == 0
    assert cache_faults() == faults
    assert cell_sums(session, posts) == {p: truth[p] for p in posts}  # the record is exact
    cached = {p: cache.read_aggregate(redis_cluster(small), p) for p in posts}
    stale = {p: a["count"] for p, a in cached.items() if a and a["count"] != truth[p]}
    assert not stale, f"aggregates that differ from the cells: {list(stale.items())[:5]}"
    assert sum(a is not None for a in cached.values()) > POSTS // 2  # aggregates got written

    # a liker's existing filter got the like (where LRU left the filter in place)
    kept = [e for e in with_filter if small.r.exists(keys.bloom_key(e.user_id))]
    assert len(kept) > len(with_filter) // 2
    raw = redis.Redis(host="127.0.0.1", port=small.port, password=small.password)
    for e in kept:
        f = bloom.load(raw.get(keys.bloom_key(e.user_id)))
        assert f is not None and e.post_id in f, e.user_id

    # what a reader sees: exact counts (aggregate or the counter-store behind it), and has_liked
    # right for likers with and without a filter (their edges, as the write path leaves them)
    sample = [(e.user_id, e.post_id) for e in rng.sample(events, 200)]
    for u, p in sample:
        seed_edge(session, u, p)
    counts, yes, no = asyncio.run(read_back(on_small, dict(truth), sample))
    assert counts == dict(truth)
    assert yes == [True] * len(sample) and no == [False] * len(sample)


def redis_cluster(small: ScratchCluster) -> Any:
    from redis.cluster import ClusterNode, RedisCluster

    return RedisCluster(
        startup_nodes=[ClusterNode("127.0.0.1", small.port)],
        password=small.password,
        decode_responses=True,
    )


def test_a_cache_that_refuses_writes_does_not_stall_the_aggregator(
    on_small: AggregatorSettings, small: ScratchCluster, producer: Producer, serialize: Any,
    session: Session,
) -> None:  # fmt: skip
    run = uuid.uuid4().hex[:8]
    posts = [f"oom-{run}-{i}" for i in range(30)]
    events = [like(p) for p in posts for _ in range(10)]
    rc = redis_cluster(small)
    used = int(small.r.info("memory")["used_memory"])
    small.r.config_set("maxmemory-policy", "noeviction")
    small.r.config_set("maxmemory", str(max(used // 2, 1024 * 1024)))  # every write: OOM
    faults = cache_faults()
    try:
        produce(producer, [msg(serialize, e) for e in events])
        with running(on_small):
            # offsets move although every aggregate write is refused: the cells are the record
            wait_for(lambda: caught_up(on_small), timeout=60, what="offsets past a full cache")
            assert cell_sums(session, posts) == dict.fromkeys(posts, 10)
            assert cache_faults() > faults
            assert all(cache.read_aggregate(rc, p) is None for p in posts)
            assert small.oom_errors() > 0

            # the cache recovers: the held posts are written by the next windows, and stay
            small.r.config_set("maxmemory-policy", keys.EVICTION_POLICY["count-cache"])
            small.r.config_set("maxmemory", f"{MAXMEMORY_MB}mb")
            # no new event needed: held writes are retried once a window regardless
            wait_for(
                lambda: all(
                    (a := cache.read_aggregate(rc, p)) is not None and a["count"] == 10
                    for p in posts
                ),
                timeout=30,
                what="held aggregates written after the cache recovered",
            )
            time.sleep(2)  # two more windows: nothing moves them away from the truth
            assert all(cache.read_aggregate(rc, p)["count"] == 10 for p in posts)  # type: ignore[index]
    finally:
        small.r.config_set("maxmemory-policy", keys.EVICTION_POLICY["count-cache"])
        small.r.config_set("maxmemory", f"{MAXMEMORY_MB}mb")
