"""The abuse features' shared state (services/abuse/shared_features.py) on the stack's real
feature-store: the same rows as the in-memory features, the same rows when two replicas each see
half of a user's likes (what several scorer replicas on a post-keyed topic do), every key
expiring, a full feature-store evicting instead of refusing, and a scorer whose feature-store
goes away deferring its batch and resuming."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Sequence

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.serialization import MessageField, SerializationContext
from redis.cluster import ClusterNode, RedisCluster

from local import transforms
from local.components.redis import ScratchCluster
from services.abuse import features, generator, metrics, scorer
from services.abuse.settings import ScorerSettings
from services.abuse.shared_features import SharedFeatures
from services.contracts import clients, events, keys, topics, workloads
from services.schema import registry_schemas
from tests.conftest import Stack

pytestmark = pytest.mark.stack

Row = Sequence[float]


def traffic(users: int, seed: int) -> list[features.Observation]:
    """Generator traffic (bursts, rings rotating hosts of a /24, shared devices, humans), its
    time shortened to 20 minutes to keep the test short; in time order."""
    return generator.generate(generator.Traffic(users=users, duration_s=1200.0, seed=seed))


def mismatches(want: Sequence[Row], got: Sequence[Row]) -> list[tuple[int, str, float, float]]:
    assert len(want) == len(got)
    return [(i, name, x, y)
            for i, (a, b) in enumerate(zip(want, got, strict=True))
            for name, x, y in zip(features.FEATURE_NAMES, a, b, strict=True)
            if not (math.isnan(x) and math.isnan(y)) and not abs(x - y) <= 1e-9]  # fmt: skip


def scorer_settings(stack: Stack) -> ScorerSettings:
    """The settings the stack's scorer runs with (its rendered env, transformed)."""
    env = transforms.workload_env(stack.layout, workloads.ABUSE_SCORER.name)
    return ScorerSettings.model_validate(
        {k.removeprefix("LIKES_").lower(): v for k, v in env.items()}
    )


@pytest.fixture(scope="module")
def store(stack: Stack) -> Iterator[RedisCluster]:
    rc = clients.feature_store(scorer_settings(stack), timeout=5.0)
    yield rc
    rc.close()


def ns() -> str:
    """A namespace of its own per test: the generator's users and addresses repeat per seed."""
    return f"t{uuid.uuid4().hex[:8]}."


def state_keys(rc: RedisCluster, prefix: str) -> list[str]:
    out: list[str] = []
    for node in rc.get_primaries():
        out += rc.get_redis_connection(node).keys(f"abuse:f:{{*:{prefix}*")
    return out


def test_shared_rows_equal_the_in_memory_rows_and_every_key_expires(store: RedisCluster) -> None:
    likes = traffic(250, seed=5)
    want = features.Features().observe_many(likes)
    prefix = ns()
    shared = SharedFeatures(store, prefix)
    got: list[Row] = []
    for i in range(0, len(likes), 500):  # the scorer's batches
        got += shared.observe_many(likes[i : i + 500])
    assert mismatches(want, got) == []
    # bounded: every key expires within the horizon, so the state is what the last hour's likes
    # hold
    found = state_keys(store, prefix)
    assert len(found) > len({o.user_id for o in likes})
    for k in found:
        ttl_ms = store.pttl(k)
        assert 0 < ttl_ms <= features.HORIZON_S * 1000, (k, ttl_ms)
    used = sum(store.memory_usage(k) or 0 for k in found)
    print(f"feature-store memory: {used / len(likes):.0f} B per like ({len(likes)} likes, "
          f"{len(found)} keys)")  # fmt: skip


def test_two_replicas_seeing_alternate_likes_give_the_rows_of_one(
    stack: Stack, store: RedisCluster
) -> None:
    """Why the shared store exists: likes.committed is keyed by post, so two scorer replicas
    each read every other like of a user. Two SharedFeatures (each with its own client, as two
    pods) fed alternate likes give the rows one instance gives; two in-memory Features do not
    (each sees half the pace and half the addresses)."""
    likes = traffic(60, seed=8)
    want = features.Features().observe_many(likes)
    prefix = ns()
    other = clients.feature_store(scorer_settings(stack), timeout=5.0)
    try:
        replicas = (SharedFeatures(store, prefix), SharedFeatures(other, prefix))
        got = [replicas[i % 2].observe_many([o])[0] for i, o in enumerate(likes)]
    finally:
        other.close()
    assert mismatches(want, got) == []
    memory = (features.Features(), features.Features())
    split = [memory[i % 2].observe(o) for i, o in enumerate(likes)]
    wrong = {name for _, name, _, _ in mismatches(want, split)}
    assert {"likes_1h", "since_previous_s", "subnet_users_1h"} <= wrong


def test_observing_a_batch_again_counts_nothing_twice(store: RedisCluster) -> None:
    """A held batch retried, or one a rebalance hands to another replica, is observed again:
    each like counts once (the likes after it get the rows of a single pass), and a retried
    like's pace is its first observation's."""
    likes = traffic(40, seed=9)
    half = len(likes) // 2
    shared = SharedFeatures(store, ns())
    first = shared.observe_many(likes[:half])
    again = shared.observe_many(likes[:half])
    pace = set(features.FEATURE_NAMES[:4])
    assert [m for m in mismatches(first, again) if m[1] in pace] == []
    rest = shared.observe_many(likes[half:])
    want = features.Features().observe_many(likes)
    assert mismatches(want[half:], rest) == []


def test_a_full_feature_store_evicts_instead_of_refusing(
    stack: Stack, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The feature-store's policy (keys.EVICTION_POLICY, as the program and the local stack
    configure it) on a 4 MB scratch cluster (an empty server holds ~1.7 MB; at 2 MB nothing is
    left to evict and every write is refused) that the traffic overfills: every batch is
    observed (none refused, nothing held), the store evicts, never answers OOM. Under the
    idem-store's noeviction the same traffic fails the batches (FeatureStoreUnavailable)."""
    small = ScratchCluster(
        tmp_path_factory.mktemp("small-feature-store"), stack.redis_password, 4, "feature-store"
    )
    s = scorer_settings(stack).model_copy(update={"feature_store_nodes": small.address})
    rc = clients.feature_store(s, timeout=5.0)
    try:
        shared = SharedFeatures(rc, ns())
        likes = traffic(600, seed=11)
        for i in range(0, len(likes), 500):
            assert len(shared.observe_many(likes[i : i + 500])) == len(likes[i : i + 500])
        assert small.evicted_keys() > 0, "the traffic never filled it: raise it or shrink it"
        assert small.oom_errors() == 0
    finally:
        rc.close()
        small.close()


# -- the scorer with its feature-store unreachable ------------------------------------------------


class Cut:
    """TCP forwarders in front of the feature-store's nodes (the client reaches each node through
    one: redis-py's address_remap), which can cut every connection and refuse new ones: the
    store unreachable from the scorer alone, while the rest of the stack keeps it."""

    def __init__(self) -> None:
        self.down = False
        self.proxies: dict[tuple[str, int], int] = {}
        self.socks: list[socket.socket] = []  # listeners
        self.conns: list[socket.socket] = []
        self.lock = threading.Lock()

    def remap(self, addr: tuple[str, int]) -> tuple[str, int]:
        with self.lock:
            if addr not in self.proxies:
                server = socket.create_server(("127.0.0.1", 0))
                self.socks.append(server)
                self.proxies[addr] = server.getsockname()[1]
                threading.Thread(target=self._serve, args=(server, addr), daemon=True).start()
            return "127.0.0.1", self.proxies[addr]

    def _serve(self, server: socket.socket, addr: tuple[str, int]) -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            if self.down:
                conn.close()
                continue
            try:
                upstream = socket.create_connection(addr, timeout=5)
            except OSError:
                conn.close()
                continue
            with self.lock:
                self.conns += [conn, upstream]
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(a: socket.socket, b: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := a.recv(65536):
                b.sendall(data)
        for s in (a, b):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        self.down = True
        with self.lock:
            conns, self.conns = self.conns, []
        for s in conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        for s in [*self.socks, *self.conns]:
            with contextlib.suppress(OSError):
                s.close()


def committed(s: ScorerSettings) -> dict[int, int]:
    c = Consumer({**clients.kafka_config(s), "group.id": s.abuse_group_id})
    try:
        parts = [TopicPartition(s.source_topic, 0)]
        return {tp.partition: tp.offset for tp in c.committed(parts, timeout=10)}
    finally:
        c.close()


def test_a_scorer_whose_feature_store_is_unreachable_defers_and_resumes(
    stack: Stack, store: RedisCluster
) -> None:
    from services.abuse.main import build

    prefix = f"test-{uuid.uuid4().hex[:8]}."
    env = stack.workload_env("read")  # the shared settings, as the revoke test takes them
    values = {k.removeprefix("LIKES_").lower(): v for k, v in env.items()}
    values = {k: v for k, v in values.items() if k in ScorerSettings.model_fields}
    scorer_env = transforms.workload_env(stack.layout, workloads.ABUSE_SCORER.name)
    values["abuse_model_target"] = scorer_env["LIKES_ABUSE_MODEL_TARGET"]
    values["feature_store_nodes"] = scorer_env["LIKES_FEATURE_STORE_NODES"]
    s = ScorerSettings.model_validate({
        **values, "abuse_topic_prefix": prefix, "abuse_group_id": f"{prefix}abuse",
        "abuse_batch": 50, "abuse_retry_max_s": 0.5, "abuse_feature_store": "shared",
    })  # fmt: skip
    specs = [topics.TopicSpec(prefix + t, 1, {}) for t in events.EVENT_TOPICS]
    topics.ensure(clients.kafka_config(s), stack.layout.kafka_brokers, specs)
    registry = clients.schema_registry(s)
    by_schema = {"like_event": tuple(prefix + t for t in events.EVENT_TOPICS)}
    registry_schemas.apply(registry, registry_schemas.subjects(topics_by_schema=by_schema))
    ser = clients.like_serializer(registry)
    ctx = SerializationContext(s.source_topic, MessageField.VALUE)
    producer = clients.producer(s)
    likes = [dataclasses.replace(o, user_id=f"{o.user_id}-{prefix}")
             for o in traffic(12, seed=4)[:40]]  # fmt: skip

    def produce(part: list[features.Observation]) -> None:
        for o in part:
            e = events.LikeEvent.new(
                intent_uuid=str(uuid.uuid4()), user_id=o.user_id, post_id=o.post_id,
                action="like", reaction="like", delta=1, region=s.region,
                client_ip=o.client_ip, device=o.device,
                account_created=None if o.account_created is None
                else int(o.account_created * 1000),
            )  # fmt: skip
            e = dataclasses.replace(e, occurred_at=int(o.ts * 1000))
            producer.produce(s.source_topic, key=keys.kafka_key(e.post_id, 0).encode(),
                             value=ser(e, ctx))  # fmt: skip
        assert producer.flush(30) == 0

    cut = Cut()
    rc = RedisCluster(
        startup_nodes=[ClusterNode(*cut.remap(n)) for n in s.feature_store_startup],
        password=s.redis_auth, socket_timeout=1.0, socket_connect_timeout=1.0,
        decode_responses=True, cluster_error_retry_attempts=1, address_remap=cut.remap,
    )  # fmt: skip
    built = build(s)
    sc = built.scorer
    # the scorer's shared features live in the feature-store; its storm watch in the store-store
    assert isinstance(sc.features, SharedFeatures) and isinstance(sc.storms, scorer.StormWatch)
    ports = {n.port for n in sc.features.rc.get_nodes()}
    assert ports == set(stack.layout.ports.feature_store), ports
    assert {n.port for n in sc.storms.rc.get_nodes()} == set(stack.layout.ports.idem_store)
    sc.features = SharedFeatures(rc, prefix)
    failures = metrics.DEPENDENCY_FAILURES.labels(scorer.FEATURE_STORE)
    try:
        sc.consumer.subscribe([s.source_topic], on_assign=sc._on_assign, on_revoke=sc._on_revoke)
        produce(likes[:20])

        def step_until(cond: object, what: str, limit_s: float = 60.0) -> None:
            deadline = time.monotonic() + limit_s
            while not cond():  # type: ignore[operator]
                assert time.monotonic() < deadline, what
                sc.step()

        step_until(lambda: committed(s).get(0, -1) == 20, "the first 20 likes were not scored")
        cut.cut()
        before = failures._value.get()
        produce(likes[20:])
        step_until(lambda: sc.held is not None, "the scorer did not hold the batch")
        assert sc.loop.waiting_for == scorer.FEATURE_STORE
        assert sc.ready()[scorer.FEATURE_STORE] is False
        assert metrics.DEFERRED._value.get() == 1
        assert failures._value.get() > before
        for _ in range(5):  # the outage lasts: still held, nothing committed past what it scored
            sc.step()
        assert sc.held is not None and committed(s)[0] == 20
        cut.down = False
        step_until(lambda: sc.held is None, "the scorer did not resume", 30)
        assert committed(s)[0] == 40
        assert all(sc.ready().values()) and metrics.DEFERRED._value.get() == 0
        # each like counted once in the shared state, whatever the attempts
        per_user: dict[str, int] = {}
        for o in likes:
            per_user[o.user_id] = per_user.get(o.user_id, 0) + 1
        for user, n in per_user.items():
            likes_key, subs, ips, devs = keys.abuse_user_keys(prefix + user)
            assert store.zcard(likes_key) == n
            # the counts a second observation would inflate (a like's member is a set member,
            # its address, /24 and device counts are not)
            mine = [o for o in likes if o.user_id == user]
            with_ip = sum(1 for o in mine if o.client_ip)
            assert sum(map(int, store.hvals(ips))) == with_ip, user
            assert sum(map(int, store.hvals(subs))) == with_ip, user
            assert sum(map(int, store.hvals(devs))) == sum(1 for o in mine if o.device), user
    finally:
        sc.consumer.close()
        built.close()
        rc.close()
        cut.close()
        AdminClient(clients.kafka_config(s)).delete_topics([x.name for x in specs])
