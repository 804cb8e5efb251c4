"""The counter aggregator against the real local stack: Kafka, registry, Cassandra, Redis Cluster.

Every test uses its own posts (uuid) and its own consumer group, whose offsets are first set to
the topics' current ends, so earlier tests' events are only re-read for the dedup warm-up.
"""

from __future__ import annotations

import json
import os
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
from cassandra.cluster import Cluster, Session
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.serialization import MessageField, SerializationContext
from prometheus_client import REGISTRY
from redis.cluster import RedisCluster

from local import transforms
from services.aggregator import cache
from services.aggregator.core import cell_region
from services.aggregator.main import build
from services.aggregator.purge import RecordingPurger, surrogate_key
from services.aggregator.settings import AggregatorSettings
from services.contracts import clients, events, keys, topics
from tests.conftest import REPO, Stack

pytestmark = pytest.mark.stack


# -- plumbing ---------------------------------------------------------------------------------
def stack_env(stack: Stack) -> dict[str, str]:
    return {
        "LIKES_KAFKA_BOOTSTRAP": stack.kafka_bootstrap,
        "LIKES_SCHEMA_REGISTRY_URL": stack.registry_url,
        "LIKES_CASSANDRA_PORT": str(stack.cassandra_port),
        "LIKES_COUNT_CACHE_NODES": ",".join(f"{h}:{p}" for h, p in stack.count_cache_nodes),
        "LIKES_REGION": "eu",
        "LIKES_REDIS_PASSWORD": stack.redis_password,
        "LIKES_CASSANDRA_USER": stack.cassandra_login[0],
        "LIKES_CASSANDRA_PASSWORD": stack.cassandra_login[1],
    }


@pytest.fixture(scope="module")
def env(stack: Stack) -> Iterator[dict[str, str]]:
    # the stack's bootstrap creates the topics; ensuring again is idempotent and makes this
    # module independent of that
    specs = transforms.topic_specs(stack.layout, stack.layout.stack)
    topics.ensure(stack.kafka_bootstrap, stack.layout.kafka_brokers, specs)
    # the stack's own aggregator would fold these tests' events into the same cells first (a
    # correct second writer, but the tests count what *their* aggregator applies): pause it
    stack.cli("local", "stop", "aggregator")
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


@pytest.fixture
def settings(base_settings: AggregatorSettings) -> AggregatorSettings:
    """A fresh group whose committed offsets are the current ends of the topics."""
    group = f"agg-test-{uuid.uuid4().hex[:10]}"
    s = base_settings.model_copy(update={"agg_group_id": group})
    c = Consumer({"bootstrap.servers": s.kafka_bootstrap, "group.id": group})
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
def running(s: AggregatorSettings) -> Iterator[Any]:
    """The aggregator's loop on a thread, stopped (and its final window flushed) on exit."""
    agg, cluster = build(s)
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
    for topic, e in evs:
        slot = (cell_region(e.region, topic), e.shard)
        expected.setdefault(e.post_id, {}).setdefault(slot, 0)
        expected[e.post_id][slot] += e.delta

    with running(settings):
        half = len(evs) // 2  # two batches: the second lands on cells the first created
        produce(producer, [msg(serialize, e, t) for t, e in evs[:half]])
        time.sleep(1.5)
        produce(producer, [msg(serialize, e, t) for t, e in evs[half:]])
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
    assert cells(session, plain)[("eu@likes.voided", 0)][0] == -2
    assert agg_count(rc, plain) == 4


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
    c = Consumer({"bootstrap.servers": settings.kafka_bootstrap, "group.id": settings.agg_group_id})
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
    c = Consumer({"bootstrap.servers": settings.kafka_bootstrap, "group.id": settings.agg_group_id})
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
    dlq = Consumer({"bootstrap.servers": settings.kafka_bootstrap, "group.id": "unused"})
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
