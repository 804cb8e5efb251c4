"""The counter aggregator against the real local stack: Kafka, registry, Cassandra, Redis Cluster.

Every test uses its own posts (uuid) and its own consumer group, whose offsets are first set to
the topics' current ends, so earlier tests' events are only re-read for the dedup warm-up.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
from cassandra.cluster import Cluster, Session
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
from confluent_kafka.serialization import MessageField, SerializationContext
from prometheus_client import REGISTRY
from redis.cluster import ClusterNode, RedisCluster

from local import transforms
from services.aggregator import cache
from services.aggregator.core import CellKey, CellState, cell_region
from services.aggregator.main import build
from services.aggregator.purge import RecordingPurger, surrogate_key
from services.aggregator.settings import AggregatorSettings
from services.contracts import bloom, clients, events, keys, topics, workloads
from services.schema import registry_schemas
from tests.conftest import REPO, Stack

pytestmark = pytest.mark.stack


# -- plumbing ---------------------------------------------------------------------------------
def stack_env(stack: Stack) -> dict[str, str]:
    tls = {"LIKES_TLS_CA_FILE": stack.ca_file} if stack.ca_file else {}
    return {
        **tls,
        "LIKES_KAFKA_BOOTSTRAP": stack.kafka_bootstrap,
        "LIKES_SCHEMA_REGISTRY_URL": stack.registry_url,
        "LIKES_CASSANDRA_PORT": str(stack.cassandra_port),
        "LIKES_COUNT_CACHE_NODES": ",".join(f"{h}:{p}" for h, p in stack.count_cache_nodes),
        "LIKES_REGION": "eu",
        "LIKES_REDIS_PASSWORD": stack.redis_password,
        "LIKES_CASSANDRA_USER": stack.cassandra_login[0],
        "LIKES_CASSANDRA_PASSWORD": stack.cassandra_login[1],
        "LIKES_KAFKA_USER": stack.kafka_login.user,
        "LIKES_KAFKA_PASSWORD": stack.kafka_login.password,
        "LIKES_SCHEMA_REGISTRY_USER": stack.registry_login.user,
        "LIKES_SCHEMA_REGISTRY_PASSWORD": stack.registry_login.password,
    }


def rest_second_writers(stack: Stack) -> None:
    """The stack's own aggregator would fold these tests' events into the same cells first (a
    correct second writer, but the tests count what *their* aggregator applies), and the
    canary's likes would be among the events a test's group replays: both rest for the module,
    and again after any `stack.up()` (left running, the stack's aggregator wins the later tests'
    gen-CAS: their posts then look unchanged to their own aggregator, which purges nothing)."""
    for name in (workloads.AGGREGATOR.name, workloads.CANARY.name):
        stack.cli("local", "stop", name)


@pytest.fixture(scope="module")
def env(stack: Stack) -> Iterator[dict[str, str]]:
    # the stack's bootstrap creates the topics; ensuring again is idempotent and makes this
    # module independent of that
    specs = transforms.topic_specs(stack.layout, stack.layout.stack)
    topics.ensure(stack.kafka_config(), stack.layout.kafka_brokers, specs)
    rest_second_writers(stack)
    try:
        yield stack_env(stack)
    finally:
        stack.up()


@pytest.fixture(scope="module")
def base_settings(env: dict[str, str]) -> AggregatorSettings:
    return AggregatorSettings(
        kafka_bootstrap=env["LIKES_KAFKA_BOOTSTRAP"],
        schema_registry_url=env["LIKES_SCHEMA_REGISTRY_URL"],
        cassandra_port=int(env["LIKES_CASSANDRA_PORT"]),
        count_cache_nodes=env["LIKES_COUNT_CACHE_NODES"],
        region=env["LIKES_REGION"],
        redis_password=env["LIKES_REDIS_PASSWORD"],
        cassandra_user=env["LIKES_CASSANDRA_USER"],
        cassandra_password=env["LIKES_CASSANDRA_PASSWORD"],
        kafka_user=env["LIKES_KAFKA_USER"],
        kafka_password=env["LIKES_KAFKA_PASSWORD"],
        schema_registry_user=env["LIKES_SCHEMA_REGISTRY_USER"],
        schema_registry_password=env["LIKES_SCHEMA_REGISTRY_PASSWORD"],
        tls_ca_file=env.get("LIKES_TLS_CA_FILE"),
    )


@pytest.fixture(scope="module")
def session(base_settings: AggregatorSettings) -> Iterator[Session]:
    cluster: Cluster
    cluster, sess = clients.cassandra(base_settings, request_timeout=10.0)
    yield sess
    cluster.shutdown()


@pytest.fixture(scope="module")
def rc(base_settings: AggregatorSettings) -> RedisCluster:
    return clients.count_cache(base_settings, timeout=2.0)


@pytest.fixture(scope="module")
def producer(base_settings: AggregatorSettings) -> Producer:
    return clients.producer(base_settings)


@pytest.fixture(scope="module")
def serialize(base_settings: AggregatorSettings) -> Callable[[events.LikeEvent, str], bytes]:
    ser = clients.like_serializer(clients.schema_registry(base_settings))

    def go(e: events.LikeEvent, topic: str = events.COMMITTED) -> bytes:
        out = ser(e, SerializationContext(topic, MessageField.VALUE))
        assert out is not None
        return out

    return go


def register_event_schema(s: AggregatorSettings, topics: Sequence[str]) -> None:
    """The deploy step for a test's own topics: producers never register schemas."""
    registry = clients.schema_registry(s)
    try:
        by_schema = {"like_event": tuple(topics)}
        registry_schemas.apply(registry, registry_schemas.subjects(topics_by_schema=by_schema))
    finally:
        registry.close()


@pytest.fixture
def settings(base_settings: AggregatorSettings) -> AggregatorSettings:
    """A fresh group whose committed offsets are the current ends of the topics."""
    group = f"agg-test-{uuid.uuid4().hex[:10]}"
    return at_the_ends(base_settings.model_copy(update={"agg_group_id": group}))


def at_the_ends(s: AggregatorSettings) -> AggregatorSettings:
    """`s`, its group's offsets committed at the current ends of its source topics: a new group
    would start at the earliest offset and read the whole run's backlog first."""
    c = Consumer({**clients.kafka_config(s), "group.id": s.agg_group_id})
    try:
        offsets = []
        for topic in s.source_topics:
            for p in c.list_topics(topic, timeout=10).topics[topic].partitions:
                _lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                offsets.append(TopicPartition(topic, p, hi))
        c.commit(offsets=offsets, asynchronous=False)
    finally:
        c.close()
    return s


def produce(
    producer: Producer, items: Sequence[tuple[str, bytes | None, bytes]], *, flush: bool = True
) -> list[tuple[int, int]]:
    """(topic, key, value) in order; returns each message's (partition, offset)."""
    out: list[tuple[int, int]] = [(-1, -1)] * len(items)

    def cb(i: int) -> Callable[[Any, Any], None]:
        def done(err: Any, msg: Any) -> None:
            assert err is None, err
            out[i] = (msg.partition(), msg.offset())

        return done

    for i, (topic, key, value) in enumerate(items):
        producer.produce(topic, key=key, value=value, on_delivery=cb(i))
    if flush:
        assert producer.flush(30) == 0
    return out


def like(
    post_id: str, *, delta: int = 1, region: str = "eu", shard: int = 0, reaction: str = "like",
    intent: str | None = None, action: events.Action = "like",
) -> events.LikeEvent:  # fmt: skip
    return events.LikeEvent.new(
        intent_uuid=intent or str(uuid.uuid4()), user_id=f"u-{uuid.uuid4().hex[:6]}",
        post_id=post_id, action=action, reaction=reaction, delta=delta, region=region,
        shard=shard,
    )  # fmt: skip


def msg(
    serialize: Callable[[events.LikeEvent, str], bytes],
    e: events.LikeEvent,
    topic: str = events.COMMITTED,
) -> tuple[str, bytes, bytes]:
    return topic, keys.kafka_key(e.post_id, e.shard).encode(), serialize(e, topic)


@contextmanager
def running(s: AggregatorSettings, **consumer_overrides: Any) -> Iterator[Any]:
    """The aggregator's loop on a thread, stopped (and its final window flushed) on exit."""
    agg, cluster = build(s, **consumer_overrides)
    stop = threading.Event()
    errors: list[BaseException] = []

    def target() -> None:
        try:
            agg.run(stop)
        except BaseException as e:  # surfaced by the test, not lost in the thread
            errors.append(e)

    t = threading.Thread(target=target, name="aggregator", daemon=True)
    t.start()
    try:
        yield agg
    finally:
        stop.set()
        t.join(60)
        cluster.shutdown()
    assert not t.is_alive(), "aggregator did not stop"
    assert not errors, errors


def wait_for(fn: Callable[[], Any], timeout: float = 45.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


def cells(session: Session, post_id: str) -> dict[tuple[str, int], tuple[int, int, dict[str, int]]]:
    rows = session.execute(
        "SELECT region, shard, value, applied_window, reactions FROM counter_cells "
        "WHERE post_id = %s",
        (post_id,),
    )
    return {(r.region, r.shard): (r.value, r.applied_window, dict(r.reactions or {})) for r in rows}


def agg_count(rc: RedisCluster, post_id: str) -> int | None:
    a = cache.read_aggregate(rc, post_id)
    return None if a is None else int(a["count"])


def counted(rc: RedisCluster, post_id: str, n: int) -> Callable[[], bool]:
    return lambda: agg_count(rc, post_id) == n


def counter(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


# -- tests ------------------------------------------------------------------------------------
def test_events_for_several_posts_and_cells_sum_exactly(
    settings: AggregatorSettings, producer: Producer, serialize: Any, session: Session,
    rc: RedisCluster,
) -> None:  # fmt: skip
    split, plain, other = (f"post-{uuid.uuid4()}" for _ in range(3))
    evs: list[tuple[str, events.LikeEvent]] = []
    # a split post: shards 0..3 in two regions, likes, unlikes and reactions
    for shard in range(4):
        for region, n in (("eu", shard + 2), ("us", 1)):
            evs += [(events.COMMITTED, like(split, shard=shard, region=region)) for _ in range(n)]
    evs += [(events.COMMITTED, like(split, shard=1, reaction="love")) for _ in range(3)]
    evs.append((events.COMMITTED, like(split, shard=2, delta=-1, action="unlike")))
    # an unsplit post with a void (anti-abuse) and an unvoid
    evs += [(events.COMMITTED, like(plain)) for _ in range(5)]
    evs.append((events.VOIDED, like(plain, delta=-1, action="void")))
    evs.append((events.VOIDED, like(plain, delta=-1, action="void")))
    evs.append((events.UNVOIDED, like(plain, delta=1, action="unvoid")))
    evs += [(events.COMMITTED, like(other, reaction="wow")) for _ in range(7)]

    expected: dict[str, dict[tuple[str, int], int]] = {}

    def expect(batch: list[tuple[str, events.LikeEvent]], where: list[tuple[int, int]]) -> None:
        for (topic, e), (partition, _offset) in zip(batch, where, strict=True):
            slot = (cell_region(e.region, topic, partition), e.shard)
            expected.setdefault(e.post_id, {}).setdefault(slot, 0)
            expected[e.post_id][slot] += e.delta

    with running(settings):
        half = len(evs) // 2  # two batches: the second lands on cells the first created
        expect(evs[:half], produce(producer, [msg(serialize, e, t) for t, e in evs[:half]]))
        time.sleep(1.5)
        expect(evs[half:], produce(producer, [msg(serialize, e, t) for t, e in evs[half:]]))
        for post, exp in expected.items():
            total = sum(exp.values())
            wait_for(counted(rc, post, total), what=f"count of {post}")

    for post, exp in expected.items():
        got = cells(session, post)
        assert {k: v[0] for k, v in got.items()} == exp, post
        a = cache.read_aggregate(rc, post)
        assert a is not None
        assert a["count"] == sum(exp.values())
        assert a["gen"] == sum(v[1] + 1 for v in got.values())
        subs = rc.mget(keys.sub_keys(post))
        for shard in range(keys.SPLIT_FACTOR):
            want = sum(v for (_r, s), v in exp.items() if s == shard)
            assert int(subs[shard] or 0) == want, (post, shard)
    assert cache.read_aggregate(rc, split)["reactions"] == {"like": 17, "love": 3}  # type: ignore[index]
    assert cache.read_aggregate(rc, other)["reactions"] == {"wow": 7}  # type: ignore[index]
    voided = {k: v for k, v in cells(session, plain).items() if k[0].startswith("eu@likes.voided#")}
    assert [v[0] for v in voided.values()] == [-2]
    assert agg_count(rc, plain) == 4


def test_partitions_added_mid_stream_lose_no_like(
    base_settings: AggregatorSettings, producer: Producer, serialize: Any, session: Session,
    rc: RedisCluster,
) -> None:  # fmt: skip
    # review D2: after a partition increase a key maps to a partition whose offsets are lower
    # than its cell's applied offset, and fold() skipped the new events as replays
    prefix = f"d2-{uuid.uuid4().hex[:8]}."
    s = base_settings.model_copy(
        update={"agg_group_id": f"agg-{prefix}", "agg_topic_prefix": prefix}
    )
    register_event_schema(s, s.source_topics)
    admin = AdminClient(clients.kafka_config(s))
    own = [*s.source_topics, s.dead_letter_topic]
    wait_all(admin.create_topics([NewTopic(t, 1, 1) for t in own]))
    topic = s.topic(events.COMMITTED)
    posts = [f"post-{uuid.uuid4()}" for _ in range(12)]

    # the consumer learns of new partitions at its next metadata refresh (default 5 minutes)
    with running(s, **{"topic.metadata.refresh.interval.ms": 1000}):
        # partition 0 holds 20 events per post: offsets up to ~240
        produce(producer, [msg(serialize, like(p), topic) for p in posts for _ in range(20)])
        for p in posts:
            wait_for(counted(rc, p, 20), what=f"first count of {p}")
        wait_all(admin.create_partitions([NewPartitions(topic, 4)]))
        wait_for(
            lambda: len(producer.list_topics(topic, timeout=10).topics[topic].partitions) == 4,
            what="the producer to see 4 partitions",
        )
        where = produce(producer, [msg(serialize, like(p), topic) for p in posts for _ in range(3)])
        assert {part for part, _ in where} - {0}, "no key moved: the test would prove nothing"
        for p in posts:
            wait_for(counted(rc, p, 23), timeout=60, what=f"count of {p} after the increase")
    for p in posts:
        assert sum(v[0] for v in cells(session, p).values()) == 23
    wait_all(admin.delete_topics(own))


def test_a_peer_regions_mirrored_events_refresh_counts_and_filters_without_counting(
    base_settings: AggregatorSettings, producer: Producer, serialize: Any, session: Session,
    rc: RedisCluster,
) -> None:  # fmt: skip
    # review D3: the aggregate was rewritten only by a LOCAL event, so region A showed region B's
    # likes only after A's next local like (or the 7-day TTL), and B's likers' filters in A said
    # a definite "no"; the mirrored topics were consumed by nothing
    peer = f"zz{uuid.uuid4().hex[:6]}"
    s = at_the_ends(base_settings.model_copy(
        update={"agg_group_id": f"agg-{peer}", "agg_peer_regions": peer,
                "agg_remote_recheck_s": 3.0},
    ))  # fmt: skip
    admin = AdminClient(clients.kafka_config(s))
    wait_all(admin.create_topics([NewTopic(t, 1, 1) for t in s.mirrored_topics]))
    register_event_schema(s, s.mirrored_topics)
    mirrored = events.mirrored(peer, events.COMMITTED)
    post, late = f"post-{uuid.uuid4()}", f"post-{uuid.uuid4()}"
    liker = f"u-{uuid.uuid4().hex[:8]}"
    rc.set(keys.bloom_key(liker), bloom.build([], capacity=32), ex=600)  # a filter here

    def peer_cell(p: str, value: int) -> None:  # as the peer's Scylla DC replicates it here
        session.execute(
            "INSERT INTO counter_cells (post_id, region, shard, value, applied_window, "
            "reactions, updated_at) VALUES (%s, %s, 0, %s, 100, {'like': %s}, toTimestamp(now()))",
            (p, f"{peer}#0", value, value),
        )

    try:
        with running(s):
            produce(producer, [msg(serialize, like(post))])  # one local like
            wait_for(counted(rc, post, 1), what="the local like")
            peer_cell(post, 5)
            remote = events.LikeEvent.new(
                intent_uuid=str(uuid.uuid4()), user_id=liker, post_id=post, action="like",
                reaction="like", delta=1, region=peer, shard=0,
            )  # fmt: skip
            produce(producer, [msg(serialize, remote, mirrored)])
            wait_for(counted(rc, post, 6), what="the peer's cells in the aggregate")
            # the peer's event for a post whose cell replicates only after the event arrived
            produce(producer, [msg(serialize, like(late, region=peer), mirrored)])
            time.sleep(1.5)
            peer_cell(late, 2)
            wait_for(counted(rc, late, 2), timeout=20, what="the recheck after a late replica")
        f = bloom.fetch(rc, liker)
        assert f is not None and post in f  # has_liked here says "maybe", not a false "no"
        local = {k: v[0] for k, v in cells(session, post).items() if not k[0].startswith(peer)}
        assert sum(local.values()) == 1  # the peer's event was not counted into our cells
    finally:
        wait_all(admin.delete_topics(s.mirrored_topics))


@pytest.mark.disruptive
def test_writes_a_count_cache_failover_lost_are_written_again(
    stack: Stack, settings: AggregatorSettings, producer: Producer, serialize: Any,
    rc: RedisCluster,
) -> None:  # fmt: skip
    # review D6: an aggregate (or Bloom bit) acked by a primary that died before its replica had
    # it was lost for good: repaired only by the post's next event, and a lost Bloom bit was a
    # permanent has_liked "no"
    post, liker = f"post-{uuid.uuid4()}", f"u-{uuid.uuid4().hex[:8]}"
    ports = stack.layout.ports.count_cache
    name = {p: f"count-cache-{i + 1}" for i, p in enumerate(ports)}
    try:
        with running(settings):
            produce(producer, [msg(serialize, like(post))])
            wait_for(counted(rc, post, 1), what="the first like")
            rc.set(keys.bloom_key(liker), bloom.build([], capacity=32), ex=600)
            primary = rc.get_node_from_key(keys.count_key(post))
            direct = redis.Redis(host=stack.host, port=int(primary.port),
                                 password=stack.redis_password)  # fmt: skip
            assert direct.execute_command("WAIT", 1, 5000) == 1  # the replica has all of it so far
            replica_port = int(direct.info("replication")["slave0"]["port"])
            replica_pid = stack.pid(name[replica_port])
            os.kill(replica_pid, signal.SIGSTOP)
            try:
                # cut the replication link while the replica cannot reconnect: from now on it
                # misses every write (a stopped process would still find them in its socket buffer)
                direct.execute_command("CLIENT", "KILL", "TYPE", "replica")
                more = [like(post) for _ in range(3)]
                mine = events.LikeEvent.new(
                    intent_uuid=str(uuid.uuid4()), user_id=liker, post_id=post, action="like",
                    reaction="like", delta=1, region="eu", shard=0,
                )  # fmt: skip
                produce(producer, [msg(serialize, e) for e in [*more, mine]])
                wait_for(counted(rc, post, 5), what="the likes on the primary alone")
                # the window's Bloom adds follow its aggregates: the count can show first
                wait_for(lambda: in_filter(rc, liker, post), what="the Bloom bit on the primary")
                before = counter("likes_aggregator_cache_redrives_total")
                stack.cli("local", "stop", "--kill", name[int(primary.port)])
            finally:
                os.kill(replica_pid, signal.SIGCONT)
            # the replica takes over with the aggregate of 1 like and a filter without the post;
            # the aggregator sees the epoch move and writes the last seconds again
            fresh = RedisCluster(
                startup_nodes=[ClusterNode(stack.host, p) for p in ports if p != int(primary.port)],
                password=stack.redis_password, decode_responses=True,
            )  # fmt: skip
            wait_for(lambda: _ok(lambda: agg_count(fresh, post) == 5), timeout=60,
                     what="the re-driven aggregate on the promoted replica")  # fmt: skip
            wait_for(lambda: _ok(lambda: in_filter(fresh, liker, post)), timeout=30,
                     what="the re-driven Bloom bit")  # fmt: skip
            assert counter("likes_aggregator_cache_redrives_total") > before
            fresh.close()
    finally:
        stack.up()  # the killed node rejoins as a replica...
        rest_second_writers(stack)  # ...and `up` restarted the stack's aggregator and canary


def in_filter(rc: RedisCluster, user: str, post: str) -> bool:
    f = bloom.fetch(rc, user)
    return f is not None and post in f


def _ok(fn: Callable[[], bool]) -> bool:
    try:
        return fn()
    except Exception:
        return False


def wait_all(futures: dict[str, Any]) -> None:
    for f in futures.values():
        f.result(30)


def test_duplicate_publications_of_one_intent_count_once(
    settings: AggregatorSettings, producer: Producer, serialize: Any, session: Session,
    rc: RedisCluster,
) -> None:  # fmt: skip
    post = f"post-{uuid.uuid4()}"
    first = [like(post) for _ in range(4)]
    hits_before = counter("likes_aggregator_dedup_hits_total")
    with running(settings):
        produce(producer, [msg(serialize, e) for e in first])
        wait_for(lambda: agg_count(rc, post) == 4, what="first count")
        # the relay re-publishes the exact bytes (same event_id); another write pod's retry has
        # a new event_id but the same intent_uuid; all in later windows
        again = [msg(serialize, e) for e in first[:2]]
        other_pod = [
            msg(serialize, like(post, intent=e.intent_uuid, reaction="love")) for e in first
        ]
        produce(producer, [*again, *other_pod, msg(serialize, like(post))])
        wait_for(lambda: agg_count(rc, post) == 5, what="count with one new intent")
        time.sleep(2.5)  # a couple more windows: nothing else may land
    assert agg_count(rc, post) == 5
    assert sum(v[0] for v in cells(session, post).values()) == 5
    assert cache.read_aggregate(rc, post)["reactions"] == {"like": 5}  # type: ignore[index]
    assert counter("likes_aggregator_dedup_hits_total") - hits_before == 6


def test_voids_and_unvoids_are_deduplicated_in_a_key_space_of_their_own(
    settings: AggregatorSettings, producer: Producer, serialize: Any, session: Session,
    rc: RedisCluster,
) -> None:  # fmt: skip
    """A void's intent is derived from its like's and the model's (services/abuse/voids.py), an
    unvoid's from its void's, and each topic-partition dedups its own intents: a void published
    twice (the scorer's own send and the outbox relay's) counts once, so does an unvoid, and no
    void is swallowed as a replay of its like, even one carrying the like's very intent."""
    from services.abuse import voids

    post = f"post-{uuid.uuid4()}"
    first, second = like(post), like(post)
    void = voids.void_intent(first.intent_uuid, "v-test")
    unvoid = voids.unvoid_intent(void)
    hits_before = counter("likes_aggregator_dedup_hits_total")
    with running(settings):
        produce(producer, [msg(serialize, e) for e in (first, second)])
        wait_for(counted(rc, post, 2), what="the two likes")
        voided = like(post, intent=void, delta=-1, action="void")
        produce(producer, [msg(serialize, voided, events.VOIDED)] * 2)
        wait_for(counted(rc, post, 1), what="the void, once")
        unvoided = like(post, intent=unvoid, delta=1, action="unvoid")
        produce(producer, [msg(serialize, unvoided, events.UNVOIDED)] * 2)
        wait_for(counted(rc, post, 2), what="the unvoid, once")
        # a void that carries its like's own intent is still a void: likes.voided's dedup
        # never saw that intent, likes.committed's did
        same = like(post, intent=second.intent_uuid, delta=-1, action="void")
        produce(producer, [msg(serialize, same, events.VOIDED)])
        wait_for(counted(rc, post, 1), what="a void with its like's intent")
        time.sleep(2.5)  # a couple more windows: nothing else may land
    assert agg_count(rc, post) == 1
    assert sum(v[0] for v in cells(session, post).values()) == 1
    assert counter("likes_aggregator_dedup_hits_total") - hits_before == 2  # one void, one unvoid


def test_replay_from_an_earlier_offset_applies_nothing_twice(
    settings: AggregatorSettings, producer: Producer, serialize: Any, session: Session,
    rc: RedisCluster,
) -> None:  # fmt: skip
    post = f"post-{uuid.uuid4()}"
    evs = [like(post, shard=n % 2) for n in range(10)]
    with running(settings):
        where = produce(producer, [msg(serialize, e) for e in evs])
        wait_for(lambda: agg_count(rc, post) == 10, what="first count")
    before = cells(session, post)

    # rewind the group to the first of these events on each partition (a replay of windows
    # that are already in the cells), then add more
    first: dict[int, int] = {}
    for p, off in where:
        first[p] = min(first.get(p, off), off)
    c = Consumer({**clients.kafka_config(settings), "group.id": settings.agg_group_id})
    c.commit(
        offsets=[TopicPartition(events.COMMITTED, p, o) for p, o in first.items()],
        asynchronous=False,
    )
    c.close()
    skipped = counter("likes_aggregator_events_replay_skipped_total")
    with running(settings):
        produce(producer, [msg(serialize, like(post, shard=n % 2)) for n in range(3)])
        wait_for(lambda: agg_count(rc, post) == 13, what="count after replay")
        time.sleep(2.5)
    assert agg_count(rc, post) == 13
    after = cells(session, post)
    assert sum(v[0] for v in after.values()) == 13
    assert all(after[k][1] > before[k][1] for k in before)  # applied offsets only moved up
    assert counter("likes_aggregator_events_replay_skipped_total") - skipped == 10


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn(
    settings: AggregatorSettings, env: dict[str, str], port: int, log: Any, **extra: str
) -> subprocess.Popen[bytes]:
    full = {
        **os.environ,
        **env,
        "LIKES_AGG_GROUP_ID": settings.agg_group_id,
        "LIKES_LOG_LEVEL": "INFO",
        **extra,
    }
    return subprocess.Popen(
        [sys.executable, "-m", "services.aggregator", "--port", str(port)],
        cwd=REPO, env=full, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip


def http_get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return 0, ""


def metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_crash_between_cell_writes_and_offset_commit_applies_nothing_twice(
    settings: AggregatorSettings, env: dict[str, str], producer: Producer, serialize: Any,
    session: Session, rc: RedisCluster, tmp_path: Path,
) -> None:  # fmt: skip
    post = f"post-{uuid.uuid4()}"
    evs = [like(post, shard=n % 3, region=("eu", "us")[n % 2]) for n in range(12)]
    where = produce(producer, [msg(serialize, e) for e in evs])

    # 1. a process that dies right after the counter-store writes of its first window
    log = (tmp_path / "aggregator.log").open("wb")
    proc = spawn(settings, env, free_port(), log, LIKES_AGG_TEST_CRASH="after-cells")
    try:
        assert proc.wait(90) == 17, (tmp_path / "aggregator.log").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    written = sum(v[0] for v in cells(session, post).values())
    assert 0 < written <= 12  # the cells have the first window...
    assert agg_count(rc, post) is None  # ...the count-cache does not
    c = Consumer({**clients.kafka_config(settings), "group.id": settings.agg_group_id})
    parts = sorted({p for p, _ in where})
    committed = c.committed([TopicPartition(events.COMMITTED, p) for p in parts], timeout=10)
    c.close()
    lowest = {p: min(o for q, o in where if q == p) for p in parts}
    assert all(tp.offset <= lowest[tp.partition] for tp in committed)  # ...nor was it committed

    # 2. a healthy process of the same group replays the window
    port = free_port()
    proc = spawn(settings, env, port, log)
    try:
        wait_for(lambda: agg_count(rc, post) == 12, what="count after the replay")
        _status, body = wait_for(
            lambda: (r := http_get(port, "/readyz"))[0] == 200 and r, what="/readyz 200"
        )
        assert json.loads(body)["checks"] == {
            "poll-loop": True, "schema-registry": True, "window-flush": True,
            "counter-store": True, "count-cache": True,
        }  # fmt: skip
        produce(producer, [msg(serialize, like(post)) for _ in range(2)])
        wait_for(lambda: agg_count(rc, post) == 14, what="count after more events")
        _, text = http_get(port, "/metrics")
        # exactly the events already in the cells were skipped on the replay
        assert metric(text, "likes_aggregator_events_replay_skipped_total") == written
        assert metric(text, "likes_aggregator_windows_flushed_total") >= 1
        assert metric(text, "likes_aggregator_store_writes_total") >= 1
        assert "likes_aggregator_consumer_lag_seconds{" in text
        assert "likes_aggregator_collapse_factor" in text
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()
    assert proc.returncode == 0, (tmp_path / "aggregator.log").read_text()
    assert sum(v[0] for v in cells(session, post).values()) == 14


def test_a_stale_generation_write_is_rejected(
    settings: AggregatorSettings, producer: Producer, serialize: Any, rc: RedisCluster
) -> None:
    post = f"post-{uuid.uuid4()}"
    with running(settings):
        produce(producer, [msg(serialize, like(post)) for _ in range(3)])
        wait_for(lambda: agg_count(rc, post) == 3, what="count")
    stored = cache.read_aggregate(rc, post)
    assert stored is not None
    gen = stored["gen"]
    # a slow emitter that computed an older aggregate, and one with the very same generation
    assert not cache.set_aggregate(rc, post, 1, gen - 1, {"like": 1}, 1, {0: 1})
    assert not cache.set_aggregate(rc, post, 2, gen, {"like": 2}, 1, {0: 2})
    assert cache.read_aggregate(rc, post) == stored
    assert rc.get(keys.sub_key(post, 0)) == "3"  # the sub-counters are behind the same CAS
    assert cache.set_aggregate(rc, post, 4, gen + 1, {"like": 4}, 2, {0: 4})
    assert agg_count(rc, post) == 4 and rc.get(keys.sub_key(post, 0)) == "4"


def test_poison_goes_to_dead_letter_after_3_attempts_and_the_partition_keeps_flowing(
    settings: AggregatorSettings, producer: Producer, serialize: Any, rc: RedisCluster
) -> None:
    post = f"post-{uuid.uuid4()}"
    key = post.encode()
    dlq = Consumer({**clients.kafka_config(settings), "group.id": "unused"})
    meta = dlq.list_topics(events.DEAD_LETTER, timeout=10).topics[events.DEAD_LETTER]
    start = []
    for p in meta.partitions:
        _lo, hi = dlq.get_watermark_offsets(TopicPartition(events.DEAD_LETTER, p), timeout=10)
        start.append(TopicPartition(events.DEAD_LETTER, p, hi))
    dlq.assign(start)

    bad_bytes = b"\x00garbage that is no Avro"
    invalid = like(post, intent="not-a-uuid")  # decodable, but not countable
    items = [
        msg(serialize, like(post)),
        (events.COMMITTED, key, bad_bytes),
        msg(serialize, invalid),
        *(msg(serialize, like(post)) for _ in range(4)),
    ]
    producer.produce(events.COMMITTED, key=key, value=bad_bytes, headers=[("trace", b"t-1")])
    where = produce(producer, items)
    bad_where = {where[1], where[2]}
    assert len({p for p, _ in where}) == 1  # one partition: the good events come after

    with running(settings):
        wait_for(lambda: agg_count(rc, post) == 5, what="good events after the poison")
    got: list[Any] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(got) < 3:
        m = dlq.poll(0.5)
        if m is not None and not m.error() and m.key() == key:
            got.append(m)
    dlq.close()
    assert len(got) == 3
    by_offset = {int(dict(m.headers())["dlq.source.offset"]): m for m in got}
    for p, off in bad_where:
        m = by_offset[off]
        h = dict(m.headers())
        assert h["dlq.source.topic"] == events.COMMITTED.encode()
        assert int(h["dlq.source.partition"]) == p
        assert h["dlq.attempts"] == b"3"
        assert h["dlq.error"]
    undecodable = by_offset[where[1][1]]
    assert undecodable.value() == bad_bytes and undecodable.key() == key
    assert "dlq.event_id" not in dict(undecodable.headers())
    h = dict(by_offset[where[2][1]].headers())
    assert h["dlq.event_id"] == invalid.event_id.encode()
    assert h["dlq.intent_uuid"] == b"not-a-uuid"
    assert by_offset[where[2][1]].value() == items[2][2]
    traced = [m for m in got if dict(m.headers()).get("trace") == b"t-1"]
    assert len(traced) == 1  # the original headers travel along
    assert counter("likes_aggregator_dead_letter_total") >= 3


def dead_letters(s: AggregatorSettings) -> Consumer:
    """A consumer positioned at the current end of the dead-letter topic."""
    dlq = Consumer({**clients.kafka_config(s), "group.id": "unused"})
    meta = dlq.list_topics(s.dead_letter_topic, timeout=10).topics[s.dead_letter_topic]
    start = []
    for p in meta.partitions:
        tp = TopicPartition(s.dead_letter_topic, p)
        start.append(TopicPartition(s.dead_letter_topic, p, dlq.get_watermark_offsets(tp, 10)[1]))
    dlq.assign(start)
    return dlq


def poll_headers(
    dlq: Consumer, want: int, match: Callable[[dict[str, bytes]], bool], timeout: float = 30
) -> list[dict[str, bytes]]:
    """Headers of the dead letters that `match`, until `want` of them or the timeout."""
    got: list[dict[str, bytes]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and len(got) < want:
        m = dlq.poll(0.5)
        if m is not None and not m.error() and match(h := dict(m.headers() or [])):
            got.append(h)
    return got


def test_an_event_that_would_break_a_store_is_dead_lettered_not_retried_forever(
    settings: AggregatorSettings, producer: Producer, serialize: Any, rc: RedisCluster
) -> None:
    # review D9: a post id longer than a partition key may be passed validation, and every
    # flush of its window failed InvalidRequest, retried forever: all partitions stalled
    post, huge = f"post-{uuid.uuid4()}", "x" * 70_000
    dlq = dead_letters(settings)
    bad = like(huge)
    with running(settings):
        produce(producer, [msg(serialize, like(post)), msg(serialize, bad),
                           msg(serialize, like(post))])  # fmt: skip
        wait_for(counted(rc, post, 2), what="the good events around the poison")
        # while the aggregator still runs: the poison's key puts it on another partition,
        # which it may reach after the good post's window is counted (once, stopped first,
        # the dead letter had not been sent yet)
        got = poll_headers(dlq, 1, lambda h: h.get("dlq.event_id") == bad.event_id.encode())
    dlq.close()
    assert len(got) == 1 and b"post_id" in got[0]["dlq.error"]


def test_a_post_the_store_refuses_at_flush_is_quarantined_and_the_window_flushes(
    settings: AggregatorSettings, session: Session, rc: RedisCluster
) -> None:
    # defence in depth behind validate(): a store that refuses one post's statements for good
    # (InvalidRequest) dead-letters that post's events by reference and flushes the others
    from services.aggregator.core import CellKey, Window

    good, huge = f"post-{uuid.uuid4()}", "y" * 70_000
    dlq = dead_letters(settings)
    agg, cluster = build(settings)
    try:
        w = Window(window_id=1)
        w.add((events.COMMITTED, 0), 10**12, CellKey(good, "eu#0", 0), 1, "like")
        w.add((events.COMMITTED, 0), 10**12 + 1, CellKey(huge, "eu#0", 0), 1, "like")
        w.add((events.COMMITTED, 0), 10**12 + 2, CellKey(huge, "eu#0", 0), 1, "like")
        agg._flush(w)
    finally:
        agg.consumer.close()
        cluster.shutdown()
    assert sum(v[0] for v in cells(session, good).values()) == 1
    assert agg_count(rc, good) == 1
    got = poll_headers(dlq, 2, lambda h: int(h.get("dlq.source.offset", b"0")) >= 10**12)
    dlq.close()
    refs = sorted(int(h["dlq.source.offset"]) for h in got if h.get("dlq.reference") == b"1")
    assert refs == [10**12 + 1, 10**12 + 2]
    assert all(b"InvalidRequest" in h["dlq.error"] for h in got)


def test_a_write_that_landed_although_its_flush_failed_is_not_written_over(
    settings: AggregatorSettings, session: Session, rc: RedisCluster
) -> None:
    """A window's cells are written and acknowledged, then its flush fails (Cassandra killed
    before the count-cache step): the store is ahead of the aggregator's cached state. The retry
    reads the post again (its void cell was never cached), skips the window's events as
    replays, and the next window must build on the store's state, not on the stale cache: it
    did, and the edge-store-quorum-loss game day lost three likes of one post."""
    from services.aggregator.core import Window

    post = f"post-{uuid.uuid4()}"
    likes = CellKey(post, cell_region("eu", events.COMMITTED, 0), 0)
    voids = CellKey(post, cell_region("eu", events.VOIDED, 0), 0)
    base = 10**12  # far above what the partition holds: the windows are built by hand
    agg, cluster = build(settings)
    try:

        def window(n: int, *entries: tuple[CellKey, int, int]) -> Window:
            w = Window(window_id=n)
            for cell, offset, delta in entries:
                topic = events.VOIDED if cell is voids else events.COMMITTED
                w.add((topic, 0), offset, cell, delta, "like")
            return w

        agg._flush(window(1, (likes, base, 1), (likes, base + 1, 1)))  # 2, cached
        # window 2's cells as its first attempt wrote them before the flush failed
        agg.store.write_cells({post: [
            (likes, CellState(2, base + 1, {"like": 2}), CellState(4, base + 3, {"like": 4})),
            (voids, CellState.empty(), CellState(-1, 7, {"like": -1})),
        ]})  # fmt: skip
        skipped = counter("likes_aggregator_events_replay_skipped_total")
        agg._flush(window(2, (likes, base + 2, 1), (likes, base + 3, 1), (voids, 7, -1)))  # retry
        assert counter("likes_aggregator_events_replay_skipped_total") - skipped == 3
        agg._flush(window(3, (likes, base + 4, 1)))
    finally:
        agg.consumer.close()
        cluster.shutdown()
    got = cells(session, post)
    assert got[(likes.region, 0)][:2] == (5, base + 4), got  # 4 likes, then one more
    assert got[(voids.region, 0)][:2] == (-1, 7), got
    assert agg_count(rc, post) == 4


def test_a_cold_window_reads_each_post_once_and_rereads_only_when_that_read_failed(
    settings: AggregatorSettings, session: Session, rc: RedisCluster
) -> None:
    """The first window after a start or a rebalance has no cached cell: its cells' states come
    from the flush's one read of the window's posts (the read its aggregates need too), not
    from a second read of the same rows. When that read fails, the cells are read again and
    the window is exact all the same. The posts' cells were written by a previous owner (they
    are in the store, not in this aggregator's cache), so a window folded onto an empty state
    instead of the store's would show as a wrong count."""
    from services.aggregator.core import Window

    base = 10**12  # far above what the partition holds: the windows are built by hand
    agg, cluster = build(settings)
    real_read = agg.store.read_posts
    reads: list[list[str]] = []
    fail_next = [False]

    def read_posts(post_ids: Sequence[str]) -> Any:
        reads.append(list(post_ids))
        if fail_next[0]:
            fail_next[0] = False
            raise TimeoutError("the flush's read timed out (test)")
        return real_read(post_ids)

    agg.store.read_posts = read_posts  # type: ignore[method-assign]
    try:
        for attempt, fail in enumerate((False, True)):
            posts = [f"post-{uuid.uuid4()}" for _ in range(3)]
            region = cell_region("eu", events.COMMITTED, 0)
            cells_of = {p: CellKey(p, region, 0) for p in posts}
            agg.store.write_cells({p: [(c, CellState.empty(), CellState(5, base, {"like": 5}))]
                                   for p, c in cells_of.items()})  # fmt: skip
            w = Window(window_id=attempt)
            for i, c in enumerate(cells_of.values()):
                for k in range(i + 1):  # 1, 2 and 3 new likes above the previous owner's 5
                    w.add((events.COMMITTED, 0), base + 1 + k, c, 1, "like")
            reads.clear()
            fail_next[0] = fail
            agg._flush(w)
            if not fail:
                assert reads == [posts], f"a cold window read its posts {len(reads)} times"
            else:  # the failed read, the cells' read, then the aggregates' read
                assert [sorted(r) for r in reads] == [sorted(posts)] * 3, reads
            for i, p in enumerate(posts):
                assert cells(session, p)[(region, 0)][:2] == (6 + i, base + 1 + i), p
                assert agg_count(rc, p) == 6 + i, p
    finally:
        agg.consumer.close()
        cluster.shutdown()


def test_a_window_at_the_head_reads_its_cold_posts_once(
    settings: AggregatorSettings,
    producer: Producer,
    serialize: Callable[[events.LikeEvent, str], bytes],
    rc: RedisCluster,
) -> None:
    """A window with fewer cold posts than a prefetch chunk (every window at the head) reads
    none ahead: its cells' states come from the flush's one read of its posts, the read its
    aggregates need anyway, not from a second read of the same rows."""
    from services.aggregator.core import PartitionDedup
    from services.aggregator.worker import PartitionState

    posts = [f"post-{uuid.uuid4()}" for _ in range(3)]
    sent = produce(producer, [msg(serialize, like(p)) for p in posts])
    topic = settings.topic(events.COMMITTED)
    reader = Consumer({**clients.kafka_config(settings), "group.id": f"read-{uuid.uuid4()}"})
    starts: dict[int, int] = {}
    for part, off in sent:
        starts[part] = min(off, starts.get(part, off))
    reader.assign([TopicPartition(topic, part, off) for part, off in starts.items()])
    ours = {keys.kafka_key(p, 0).encode() for p in posts}
    got: list[Any] = []
    deadline = time.monotonic() + 30
    while len(got) < len(posts) and time.monotonic() < deadline:
        got += [m for m in reader.consume(10, 1.0) if m.error() is None and m.key() in ours]
    reader.close()
    agg, cluster = build(settings)
    real_read = agg.store.read_posts
    reads: list[list[str]] = []

    def read_posts(post_ids: Sequence[str]) -> Any:
        reads.append(sorted(post_ids))
        return real_read(post_ids)

    agg.store.read_posts = read_posts  # type: ignore[method-assign]
    try:
        for part in starts:
            agg.parts[(topic, part)] = PartitionState(PartitionDedup(1000, 10**9), warm_until=0)
        agg._handle_batch(got)
        agg._flush(agg.windower.take())
    finally:
        agg.consumer.close()
        cluster.shutdown()
    assert reads == [sorted(posts)], f"the window's posts were read {len(reads)} times: {reads}"
    assert [agg_count(rc, p) for p in posts] == [1, 1, 1]


def test_cells_read_while_the_window_was_open_are_dropped_with_a_change_of_owners(
    settings: AggregatorSettings,
    session: Session,
    rc: RedisCluster,
    producer: Producer,
    serialize: Callable[[events.LikeEvent, str], bytes],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cold post's cells are read while its window is open (worker._prefetch_cold). If its
    partition changes owners meanwhile, that read is stale: another owner counts a like into
    the cell, then the partition comes back. The window after must fold onto what the other
    owner wrote (7), not onto the first read (6: that owner's like lost)."""
    from services.aggregator import worker
    from services.aggregator.core import PartitionDedup
    from services.aggregator.worker import PartitionState

    monkeypatch.setattr(worker, "PREFETCH_CHUNK", 1)  # read each cold post at once
    post = f"post-{uuid.uuid4()}"
    (part, o1), (_, o2) = produce(producer, [msg(serialize, like(post)) for _ in range(2)])
    tp = (settings.topic(events.COMMITTED), part)
    cell = CellKey(post, cell_region("eu", events.COMMITTED, part), 0)
    reader = Consumer({**clients.kafka_config(settings), "group.id": f"read-{uuid.uuid4()}"})
    reader.assign([TopicPartition(tp[0], part, o1)])
    got: list[Any] = []
    while len(got) < 2:
        got += [m for m in reader.consume(2, 5.0) if m.error() is None]
    reader.close()
    m1, m2 = got[:2]
    assert (m1.offset(), m2.offset()) == (o1, o2)
    agg, cluster = build(settings)
    try:
        # a previous owner's cell: 5 likes, everything before o1 folded
        agg.store.write_cells(
            {post: [(cell, CellState.empty(), CellState(5, o1 - 1, {"like": 5}))]}
        )
        agg.parts[tp] = PartitionState(PartitionDedup(1000, 10**9), warm_until=0)
        agg._handle_batch([m1])
        assert len(agg._prefetch) == 1  # read while the window is open: the 5
        assert agg._prefetch[0].result(10)[post][0].value == 5
        agg._drop([tp])  # revoked: the window's events and the cells go
        # the other owner folds o1 and commits o1 + 1; the partition comes back to us
        agg.store.write_cells(
            {post: [(cell, CellState(5, o1 - 1, {}), CellState(6, o1, {"like": 6}))]}
        )
        agg.parts[tp] = PartitionState(PartitionDedup(1000, 10**9), warm_until=0)
        agg._handle_batch([m2])
        agg._flush(agg.windower.take())
    finally:
        agg.consumer.close()
        cluster.shutdown()
    assert cells(session, post)[(cell.region, 0)][:2] == (7, o2)
    assert agg_count(rc, post) == 7


def test_cdn_purge_is_recorded_for_each_changed_post(
    settings: AggregatorSettings, producer: Producer, serialize: Any, rc: RedisCluster
) -> None:
    posts = [f"post-{uuid.uuid4()}" for _ in range(3)]
    untouched = f"post-{uuid.uuid4()}"
    with running(settings):
        produce(producer, [msg(serialize, like(p)) for p in posts for _ in range(2)])
        for p in posts:
            wait_for(counted(rc, p, 2), what=f"count of {p}")
    recorded = set(RecordingPurger(rc).recorded())
    assert {surrogate_key(p) for p in posts} <= recorded
    assert surrogate_key(untouched) not in recorded


def test_counter_store_results_share_one_row_class(session: Session) -> None:
    # The driver's default row factory built a new namedtuple class for every result: 27 % of
    # the aggregator's store thread in a profile, where a window reads thousands of one-post
    # results. The services' sessions (clients.cassandra) build a column list's class once.
    from services.aggregator.store import CounterStore

    store = CounterStore(session)
    posts = [f"post-{uuid.uuid4()}" for _ in range(2)]
    plan = {p: [(CellKey(p, "eu#0", 0), CellState.empty(), CellState(3, 7, {"like": 3}))]
            for p in posts}  # fmt: skip
    assert store.write_posts(plan) == dict.fromkeys(posts, True)
    first, second = (session.execute(store.q_read_many, ([p],)).one() for p in posts)
    assert type(first) is type(second)
    assert (second.region, second.value, second.applied_window) == ("eu#0", 3, 7)
    read = store.read_posts(posts)
    assert {p: [(r.value, r.applied) for r in rows] for p, rows in read.items()} == {
        p: [(3, 7)] for p in posts
    }


def test_a_stale_owners_cells_never_roll_a_newer_row_back(session: Session) -> None:
    # Cells are written last-write-wins by offset (services/aggregator/store.py): of two owners
    # of a partition mid-rebalance, the row further along the log wins on the server, whatever
    # the order the writes arrive in; a replay rewrites the same row; a row written at wall-clock
    # time (the CAS of earlier versions) is overwritten by the first offset-stamped write.
    from services.aggregator.store import CounterStore

    store = CounterStore(session)
    post, older = f"post-{uuid.uuid4()}", f"post-{uuid.uuid4()}"
    cell, empty = CellKey(post, "eu#0", 0), CellState.empty()
    ahead = CellState(9, 300, {"like": 9})  # the successor, folded up to offset 300
    behind = CellState(4, 200, {"like": 3, "love": 1})  # the stale owner, up to 200
    store.write_cells({post: [(cell, empty, ahead)]})
    store.write_cells({post: [(cell, empty, behind)]})  # arrives later, but is older
    assert cells(session, post) == {("eu#0", 0): (9, 300, {"like": 9})}
    store.write_cells({post: [(cell, behind, ahead)]})  # a replay of the same fold
    assert cells(session, post) == {("eu#0", 0): (9, 300, {"like": 9})}

    assert store.write_posts({older: [(CellKey(older, "eu#0", 0), empty, behind)]})[older]
    store.write_cells({older: [(CellKey(older, "eu#0", 0), behind, ahead)]})
    assert cells(session, older) == {("eu#0", 0): (9, 300, {"like": 9})}


def test_cells_of_many_posts_are_read_and_written_in_chunks_and_a_refused_post_is_named(
    session: Session,
) -> None:
    from services.aggregator.store import READ_CHUNK, WRITE_CHUNK, CounterStore, PoisonPosts

    store = CounterStore(session)
    posts = [f"post-{uuid.uuid4()}" for _ in range(2 * max(READ_CHUNK, WRITE_CHUNK) + 3)]
    plans = {
        p: [(CellKey(p, "eu#0", s), CellState.empty(), CellState(i + s, i, {"like": i + s}))
            for s in range(1 + i % 3)]
        for i, p in enumerate(posts)
    }  # fmt: skip
    store.write_cells(plans)
    read = store.read_posts(posts)
    assert {p: sorted((r.shard, r.value, r.applied) for r in rows) for p, rows in read.items()} == {
        p: [(s, i + s, i) for s in range(1 + i % 3)] for i, p in enumerate(posts)
    }
    huge = "y" * 70_000  # a partition key over 64 KiB: refused for good, in any chunk
    with pytest.raises(PoisonPosts) as e:
        store.read_posts([*posts[:5], huge, *posts[5:9]])
    assert list(e.value.errors) == [huge]
