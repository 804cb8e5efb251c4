"""Aggregator throughput against the raw consume rate of the same topic, and its collapse factor.

    LIKES_HOME=... LIKES_PORT_OFFSET=... .venv/bin/python bench/bench_aggregator.py \
        [--events 200000] [--posts 10000] [--zipf 1.1] [--no-hot-pools] [--small-cache-mb 32]

Needs a running local stack (`likes local up`). Writes a Zipf-distributed stream of like events
(a few hot posts, a long tail) to private copies of the topics (`bench-<id>.likes.*`), then, in
the same run, times
  1. a bare consumer reading and deserializing every message (the baseline), before and again
     after the aggregator's run: the faster of the two is the baseline (one run moved 3.4-4.6 s
     between runs of this bench on a shared machine), and
  2. the aggregator (dedup, windows, counter-store writes, count-cache, purge, commit) from the
     first offset until its committed offsets reach the end of the topic,
and prints events/s of both, their ratio, what always-replicate cost (time copying aggregates
into the 4 hot pools, their memory per post; `--no-hot-pools` runs without it), events per
counter-store write (overall and for the viral post), whether every post's cells sum exactly to
its events, and one JSON line with all of it. Every event is a distinct liker: with
`--small-cache-mb 32 --events 1000000` the aggregator writes a million likers' filters into a
32 MB count-cache of its own (issue 10, hole 2), which then reports OOM errors, evictions, its
peak memory, and whether the read path answers every count and sampled has_liked right from it.
No assertions.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import itertools
import json
import random
import tempfile
import threading
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis as redis_py
from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.serialization import MessageField, SerializationContext
from prometheus_client import REGISTRY

from local import layout
from local import tls as local_tls
from local.components import cassandra, kafka, redis
from local.components import schema_registry as registry_component
from services.aggregator.main import build
from services.aggregator.settings import AggregatorSettings
from services.common import heap
from services.contracts import clients, events, hotkeys, keys, topics
from services.contracts import kafka as kafka_contract
from services.read.core import Reader
from services.read.stores import CassandraStore, RedisCountCache
from services.schema import registry_schemas


def zipf_cdf(n: int, s: float) -> list[float]:
    weights = [1.0 / (k**s) for k in range(1, n + 1)]
    return list(itertools.accumulate(weights))


def settings_for(lay: layout.Layout, prefix: str, always_replicate: bool) -> AggregatorSettings:
    ports = lay.ports
    brokers = ports.kafka_brokers[: lay.kafka_brokers]
    return AggregatorSettings(
        kafka_bootstrap=",".join(f"{layout.HOST}:{p}" for p in brokers),
        schema_registry_url=registry_component.url(lay),
        # the stack's profile: over TLS (the test stack's) every store wants the stack's CA
        tls_ca_file=local_tls.client_ca(lay),
        cassandra_port=ports.cassandra_native,
        count_cache_nodes=",".join(f"{layout.HOST}:{p}" for p in ports.count_cache),
        hot_pools=",".join(f"{layout.HOST}:{p}" for p in ports.hot_pools),
        agg_always_replicate=always_replicate,
        agg_topic_prefix=prefix,
        agg_group_id=f"{prefix}aggregator",
        agg_dedup_capacity=100_000,
        log_level="WARNING",
        redis_password=redis.password(lay),
        cassandra_user=cassandra.service_login(lay)[0],
        cassandra_password=cassandra.service_login(lay)[1],
        kafka_user=kafka.login(lay, kafka_contract.SERVICE_USER).user,
        kafka_password=kafka.login(lay, kafka_contract.SERVICE_USER).password,
        schema_registry_user=registry_component.credentials(lay).user,
        schema_registry_password=registry_component.credentials(lay).password,
    )  # fmt: skip


def produce(
    s: AggregatorSettings, n: int, posts: int, zipf: float, seed: int, sample_every: int = 5000
) -> tuple[Counter[str], list[tuple[str, str]]]:
    """Writes the stream (every event a distinct liker); returns the number of events per post
    (the truth) and every `sample_every`-th (user, post)."""
    rnd = random.Random(seed)
    cdf = zipf_cdf(posts, zipf)
    total = cdf[-1]
    post_ids = [f"bench-{uuid.uuid4()}" for _ in range(posts)]
    ser = clients.like_serializer(clients.schema_registry(s))
    ctx = SerializationContext(s.topic(events.COMMITTED), MessageField.VALUE)
    prod = clients.producer(s, **{"linger.ms": 20, "batch.num.messages": 10000})
    topic = s.topic(events.COMMITTED)
    truth: Counter[str] = Counter()
    sampled: list[tuple[str, str]] = []
    for i in range(n):
        post = post_ids[bisect.bisect_left(cdf, rnd.random() * total)]
        e = events.LikeEvent.new(
            intent_uuid=str(uuid.uuid4()), user_id=f"u{i}", post_id=post, action="like",
            reaction=rnd.choice(("like", "like", "like", "love", "wow")), delta=1, region="local",
        )  # fmt: skip
        truth[post] += 1
        if i % sample_every == 0:
            sampled.append((e.user_id, post))
        while True:
            try:
                prod.produce(topic, key=keys.kafka_key(post, 0).encode(), value=ser(e, ctx))
                break
            except BufferError:
                prod.poll(0.05)
        prod.poll(0)
    prod.flush(60)
    return truth, sampled


def raw_consume(s: AggregatorSettings, n: int) -> float:
    """Baseline: read and deserialize every message, nothing else."""
    topic = s.topic(events.COMMITTED)
    des = clients.like_deserializer(clients.schema_registry(s))
    c = Consumer(
        {**clients.kafka_config(s), "group.id": f"{s.agg_topic_prefix}raw",
         "enable.auto.commit": False, "auto.offset.reset": "earliest"}
    )  # fmt: skip
    parts = c.list_topics(topic, timeout=10).topics[topic].partitions
    c.assign([TopicPartition(topic, p, 0) for p in parts])
    ctx = SerializationContext(topic, MessageField.VALUE)
    seen = 0
    t0 = time.perf_counter()
    while seen < n:
        for m in c.consume(1000, 1.0):
            if m.error() is None:
                des(m.value(), ctx)
                seen += 1
    dt = time.perf_counter() - t0
    c.close()
    return dt


def cells_match(s: AggregatorSettings, truth: Counter[str]) -> bool:
    """Every post's cells sum to the events written for it."""
    cluster, session = clients.cassandra(s, request_timeout=10.0)
    try:
        q = session.prepare("SELECT value FROM counter_cells WHERE post_id = ?")
        return all(sum(r.value for r in session.execute(q, (p,))) == n for p, n in truth.items())
    finally:
        cluster.shutdown()


def sample(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


def hot_pool_cost(s: AggregatorSettings, truth: Counter[str]) -> dict[str, float]:
    """What always-replicate cost this run: time in the copies, copies written, and the memory a
    post's copy takes in each pool (MEMORY USAGE over a sample, times the pools)."""
    seconds = sample("likes_aggregator_hot_pool_copy_seconds_sum")
    written = (
        REGISTRY.get_sample_value("likes_aggregator_hot_pool_copies_total", {"result": "written"})
        or 0.0
    )
    host, port = s.hot_pool_addresses[0]
    r = redis_py.Redis(host=host, port=port, password=s.redis_auth)
    sizes = [r.memory_usage(keys.count_key(p)) for p in list(truth)[:200]]
    per_copy = [b for b in sizes if b]
    r.close()
    bytes_per_post = (sum(per_copy) / len(per_copy) if per_copy else 0.0) * len(
        s.hot_pool_addresses
    )
    return {"copy_seconds": seconds, "copies_written": written, "bytes_per_post": bytes_per_post}


def read_back(
    s: AggregatorSettings, truth: Counter[str], liked: list[tuple[str, str]]
) -> dict[str, Any]:
    """What the read path answers from the cache the aggregator wrote: every post's count (the
    aggregate or the counter-store behind it) and has_liked for sampled likers (their edges
    seeded as the write path leaves them) and for a post they never liked."""
    cluster, session = clients.cassandra(s, request_timeout=10.0)
    try:
        q = session.prepare(
            "INSERT INTO edges (user_id, kind, ref, state, reaction, void, updated_at) "
            "VALUES (?, 'edge', ?, 'liked', 'like', false, ?)"
        )
        for u, p in liked:
            session.execute(q, (u, p, datetime.now(UTC)))
    finally:
        cluster.shutdown()

    async def go() -> dict[str, Any]:
        cache_, store = RedisCountCache(s, timeout_s=2.0), CassandraStore(s, timeout_s=10.0)
        try:
            await asyncio.to_thread(store._connect)
            reader = Reader(cache_, store, cache_timeout_s=2.0, store_timeout_s=10.0)
            posts = list(truth)
            counts: dict[str, int | None] = {}
            for i in range(0, len(posts), 50):
                for v in await reader.counts(posts[i : i + 50]):
                    counts[v.post_id] = v.count
            yes = [(await reader.has_liked(u, [p]))[0] for u, p in liked]
            no = [(await reader.has_liked(u, [f"never-{p}"]))[0] for u, p in liked]
        finally:
            await store.close()
            await cache_.close()
        return {
            "counts_exact": counts == dict(truth),
            "has_liked_right": yes == [True] * len(liked) and no == [False] * len(liked),
            "has_liked_sampled": len(liked),
        }

    return asyncio.run(go())


def run_aggregator(s: AggregatorSettings, n: int) -> tuple[float, dict[str, float]]:
    topic = s.topic(events.COMMITTED)
    agg, cluster = build(s)
    watch = Consumer({**clients.kafka_config(s), "group.id": s.agg_group_id})
    parts = watch.list_topics(topic, timeout=10).topics[topic].partitions
    ends = {p: watch.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
    names = [
        "likes_aggregator_store_writes_total", "likes_aggregator_store_batches_total",
        "likes_aggregator_windows_flushed_total", "likes_aggregator_cache_writes_total",
        "likes_aggregator_flush_seconds_sum",
    ]  # fmt: skip
    before = {k: sample(k) for k in names}
    before["likes_aggregator_cache_writes_total"] = sample_cache()
    stop = threading.Event()
    t = threading.Thread(target=agg.run, args=(stop,), daemon=True)
    started = time.perf_counter()
    t.start()
    # the clock starts once the group gave the aggregator its partitions (the baseline assigns
    # them itself): the join is a one-off per restart, not throughput
    while len(agg.parts) < len(parts) and time.perf_counter() - started < 60:
        time.sleep(0.005)
    t0 = time.perf_counter()
    while True:
        time.sleep(0.05)
        try:
            got = watch.committed([TopicPartition(topic, p) for p in parts], timeout=10)
        except KafkaException:  # the group's coordinator moving (a stack just started): again
            continue
        if all(tp.offset >= ends[tp.partition] for tp in got):
            break
    dt = time.perf_counter() - t0
    print(f"group join              : {t0 - started:10.1f} s (not counted)")
    stop.set()
    t.join(60)
    watch.close()
    cluster.shutdown()
    after = {k: sample(k) for k in names}
    after["likes_aggregator_cache_writes_total"] = sample_cache()
    return dt, {k: after[k] - before[k] for k in names}


def sample_cache() -> float:
    return sum(
        REGISTRY.get_sample_value("likes_aggregator_cache_writes_total", {"result": r}) or 0.0
        for r in ("applied", "stale")
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--posts", type=int, default=10_000)
    ap.add_argument("--zipf", type=float, default=1.1)
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument(
        "--small-cache-mb",
        type=int,
        metavar="MB",
        help="the aggregator writes to a one-node count-cache of this maxmemory (issue 10, hole "
        "2: e.g. 32 with --events 1000000, a million distinct likers), which then reports OOM "
        "errors, evictions and what the read path answers from it",
    )
    ap.add_argument(
        "--no-hot-pools",
        action="store_true",
        help="turn always-replicate off (compare a run without the hot-pool copies)",
    )
    args = ap.parse_args()

    lay = layout.for_benchmark()
    prefix = f"bench-{uuid.uuid4().hex[:8]}."
    s = settings_for(lay, prefix, not args.no_hot_pools)
    small = None
    if args.small_cache_mb:
        home = Path(tempfile.mkdtemp(prefix="bench-small-cache-"))
        small = redis.ScratchCluster(home, s.redis_auth or "", args.small_cache_mb)
        s = s.model_copy(update={"count_cache_nodes": small.address, "cdn_purger": "none"})
    specs = [
        topics.TopicSpec(prefix + t, args.partitions, {})
        for t in (*events.EVENT_TOPICS, events.DEAD_LETTER)
    ]
    topics.ensure(clients.kafka_config(s), lay.kafka_brokers, specs)
    # the deploy step for the run's own topics: producers never register schemas
    registry = clients.schema_registry(s)
    by_schema = {"like_event": tuple(prefix + t for t in events.EVENT_TOPICS)}
    registry_schemas.apply(registry, registry_schemas.subjects(topics_by_schema=by_schema))
    registry.close()
    try:
        t0 = time.perf_counter()
        truth, liked = produce(s, args.events, args.posts, args.zipf, args.seed)
        print(f"produced {args.events} events over {len(truth)} posts (zipf s={args.zipf}, "
              f"{args.partitions} partitions) in {time.perf_counter() - t0:.1f}s")  # fmt: skip
        heap.settle()  # both runs below as services/aggregator/__main__ runs (common/heap.py)
        raw_first = raw_consume(s, args.events)
        agg_s, d = run_aggregator(s, args.events)
        raw_again = raw_consume(s, args.events)
        raw_s = min(raw_first, raw_again)
        exact = cells_match(s, truth)
        hot = hot_pool_cost(s, truth) if s.agg_always_replicate else None
        memory = None
        if small is not None:
            info = small.r.info("memory")
            memory = {
                "maxmemory_mb": args.small_cache_mb,
                "oom_errors": small.oom_errors(),
                "evicted_keys": small.evicted_keys(),
                "used_memory_peak_mb": round(int(info["used_memory_peak"]) / 2**20, 1),
                **read_back(s, truth, liked),
            }
    finally:
        AdminClient(clients.kafka_config(s)).delete_topics([x.name for x in specs])
        if small is not None:
            small.close()
    raw_rate = args.events / raw_s
    agg_rate = args.events / agg_s
    writes = d["likes_aggregator_store_writes_total"]
    print(f"raw consume+deserialize : {raw_rate:10.0f} events/s  ({raw_s:.1f}s; the faster of "
          f"{raw_first:.1f}s before and {raw_again:.1f}s after the aggregator)")  # fmt: skip
    print(f"aggregator (end to end) : {agg_rate:10.0f} events/s  ({agg_s:.1f}s)")
    print(f"aggregator / raw        : {agg_rate / raw_rate:10.3f}")
    print(
        f"windows flushed         : {d['likes_aggregator_windows_flushed_total']:10.0f}  "
        f"({d['likes_aggregator_flush_seconds_sum']:.1f}s of it flushing)"
    )
    print(f"counter-store cell writes: {writes:9.0f}  (of "
          f"{d['likes_aggregator_store_batches_total']:.0f} post writes)")  # fmt: skip
    print(f"count-cache writes      : {d['likes_aggregator_cache_writes_total']:10.0f}")
    collapse = args.events / max(writes, 1)
    print(f"collapse factor         : {collapse:10.1f} events per cell write")
    # the viral post has one cell written per window at most, so its events over the windows
    # flushed is a lower bound of its events per cell write (windows without it write nothing)
    viral = truth.most_common(1)[0][1] / max(d["likes_aggregator_windows_flushed_total"], 1)
    print(f"viral post              : {viral:10.1f} events per cell write (at least)")
    print(f"exact                   : {exact}")
    if hot is not None:
        pools, ttl = len(s.hot_pool_addresses), hotkeys.ALWAYS_REPLICATE_TTL_S
        print(f"always-replicate        : {hot['copy_seconds']:10.2f} s copying "
              f"({hot['copy_seconds'] / agg_s:.1%} of the run), "
              f"{hot['copies_written']:.0f} copies written, "
              f"{hot['bytes_per_post']:.0f} B/post in {pools} pools for {ttl} s")  # fmt: skip
    if memory is not None:
        print(f"small count-cache       : {memory}")
    print(json.dumps({
        "small_cache": memory,
        "always_replicate": hot is not None,
        "hot_pool_copy_share": round(hot["copy_seconds"] / agg_s, 4) if hot else None,
        "hot_pool_bytes_per_post": round(hot["bytes_per_post"]) if hot else None,
        "raw_events_s": round(raw_rate), "aggregator_events_s": round(agg_rate),
        "raw_runs_s": [round(raw_first, 2), round(raw_again, 2)],
        "ratio": round(agg_rate / raw_rate, 3), "collapse": round(collapse, 1),
        "viral_events_per_write": round(viral, 1), "exact": exact,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
