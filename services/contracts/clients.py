"""One factory per store, configured from Settings, so every service talks to them the same way."""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import hashlib
import io
import json
import logging
import ssl
import time
from collections import namedtuple
from collections.abc import Iterable, Sequence
from typing import Any

import fastavro
from cassandra import (
    AuthenticationFailed,
    InvalidRequest,
    OperationTimedOut,
    RequestExecutionException,
)
from cassandra import protocol as cql_protocol
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import (
    EXEC_PROFILE_DEFAULT,
    Cluster,
    ExecutionProfile,
    NoHostAvailable,
    Session,
)
from cassandra.connection import ConnectionException
from cassandra.policies import (
    DCAwareRoundRobinPolicy,
    ExponentialReconnectionPolicy,
    TokenAwarePolicy,
)
from cassandra.query import _clean_column_name
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import SerializationError
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import NoScriptError, RedisClusterException, RedisError
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_exponential

from services.contracts import events, kafka, registry, tls
from services.contracts.settings import FeatureStoreSettings, Settings

log = logging.getLogger("clients")


def count_cache(settings: Settings, timeout: float = 0.5) -> RedisCluster:
    """The count-cache cluster. Short timeouts: a read falls through rather than waits."""
    return _redis_cluster(settings, settings.count_cache_startup, timeout)


def idem_store(settings: Settings, timeout: float = 0.5) -> RedisCluster:
    """The idempotency store: a Redis Cluster with AOF, as the program declares it. A shard
    that is down fails its own keys (closed: 503), not the others'."""
    return _redis_cluster(settings, settings.idem_store_startup, timeout)


def feature_store(settings: FeatureStoreSettings, timeout: float = 0.5) -> RedisCluster:
    """The abuse scorer's shared feature state: a Redis Cluster of its own, no AOF, evicting
    when full (keys.EVICTION_POLICY), as the program declares it. Down or unreachable, the
    scorer holds its batch (services/abuse/scorer.py); nothing else depends on it."""
    return _redis_cluster(settings, settings.feature_store_startup, timeout)


def _redis_cluster(
    settings: Settings, startup: Sequence[tuple[str, int]], timeout: float
) -> RedisCluster:
    """A cluster client of ours: the stack's Redis password, `timeout` to connect and answer,
    one retry after a cluster error (the caller decides what a failure means)."""
    return RedisCluster(
        startup_nodes=[ClusterNode(h, p) for h, p in startup],
        password=settings.redis_auth,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        decode_responses=True,
        cluster_error_retry_attempts=1,
    )


# everything a Redis Cluster client raises when a request cannot be served: a cluster it cannot
# reach at all raises RedisClusterException, which is not a RedisError
REDIS_ERRORS: tuple[type[Exception], ...] = (RedisError, RedisClusterException)


def eval_per_node(
    rc: RedisCluster,
    script: str,
    calls: Sequence[tuple[Sequence[str], Sequence[Any]]],
    route: Sequence[str] | None = None,
) -> list[Any]:
    """Run `script` once per (keys, args), one plain pipeline per node owning the keys' slot
    (`route[i]`: the key whose node runs call i, for a script that passes its keys as
    arguments; by default its first key).

    redis-py refuses scripts in a cluster pipeline; one EVAL per round trip would make a window
    of 100 k likes 100 k round trips. EVALSHA: the script body is sent once per node (SCRIPT
    LOAD), not with every call (a profile of the aggregator had a quarter of its time in Bloom
    adds, most of it packing EVAL bodies). A node that lost its script cache (a restart, a
    promoted replica) answers NOSCRIPT: loaded again and retried once. A MOVED (failover,
    resharding) raises: the caller refreshes the slot map (`rc.nodes_manager.initialize()`) and
    retries, so scripts must be idempotent.

    The nodes' pipelines run at once, each on its own connection: one after the other, the
    caller waited for the sum of the nodes' script time, not the longest (an aggregator flush of
    9 k posts spent 0.7 s of py-spy samples reading the three nodes' answers in turn). Calls on
    one node keep their order; a node that fails raises after every node has answered (the
    others' calls are applied: idempotent, as above).
    """
    sha = hashlib.sha1(script.encode()).hexdigest()
    by_node: dict[str, list[int]] = {}
    nodes: dict[str, Any] = {}
    for i, (ks, _args) in enumerate(calls):
        node = rc.get_node_from_key(ks[0] if route is None else route[i])
        nodes[node.name] = node
        by_node.setdefault(node.name, []).append(i)

    def run(name: str) -> list[Any]:
        conn = rc.get_redis_connection(nodes[name])
        for attempt in (1, 2):
            pipe = conn.pipeline(transaction=False)
            for i in by_node[name]:
                ks, args = calls[i]
                pipe.evalsha(sha, len(ks), *ks, *args)
            try:
                return list(pipe.execute(raise_on_error=True))
            except NoScriptError:
                if attempt == 2:
                    raise
                conn.script_load(script)
        raise AssertionError("unreachable")

    names = list(by_node)
    if len(names) == 1:
        answers = [run(names[0])]
    else:
        futures = [_node_pool().submit(run, n) for n in names]
        concurrent.futures.wait(futures)
        answers = [f.result() for f in futures]  # the first node's error, if any, raises
    out: list[Any] = [None] * len(calls)
    for name, results in zip(names, answers, strict=True):
        for i, r in zip(by_node[name], results, strict=True):
            out[i] = r
    return out


@functools.cache
def _node_pool() -> concurrent.futures.ThreadPoolExecutor:
    """eval_per_node's threads, one per node a call may span (started on first use)."""
    return concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="redis-node")


# The store's faults: the same request may succeed later or on another node. Answer 503 +
# Retry-After, degrade, or retry on these. Not the driver's whole DriverException: that also holds
# the refusals below, and a refused request answered "503, retry" is retried forever (review D12).
CASSANDRA_ERRORS: tuple[type[Exception], ...] = (
    RequestExecutionException,  # Unavailable, Read/WriteTimeout, Read/WriteFailure (replicas)
    OperationTimedOut,  # the client stopped waiting for the coordinator
    NoHostAvailable,  # no node took it (each node's own error inside)
    ConnectionException,  # the connection closed or was saturated under the request
    AuthenticationFailed,  # a (re)connect's login failed: system_auth unreachable, a secret rotated
    cql_protocol.ServerError,  # the coordinator failed internally
    cql_protocol.RequestExecutionException,  # raw: Overloaded, IsBootstrapping, Truncate errors
)

# The store refused the request itself (InvalidRequest: a partition key over 64 KiB, a value it
# cannot hold): the same request is refused every time. A client error for a request, a dead
# letter for an event; never a 503 or a retry. Anything else the driver raises (Unauthorized,
# a syntax or schema error) is our bug or our deployment's, and surfaces as one.
CASSANDRA_REFUSED: tuple[type[Exception], ...] = (InvalidRequest,)


@functools.lru_cache(maxsize=1024)
def _row_class(colnames: tuple[str, ...]) -> Any:
    # rename: a name namedtuple refuses (a keyword, a duplicate) becomes _<index>, where the
    # driver's factory logs a warning and renames every column
    return namedtuple("Row", [_clean_column_name(c) for c in colnames], rename=True)


def row_factory(colnames: Iterable[str], rows: Iterable[Sequence[Any]]) -> list[Any]:
    """The driver's named_tuple_factory, with the row class built once per column list.

    The driver's default builds a new namedtuple class for every result (0.43 ms for a cell
    read's result on the loaded 2-core dev box, against 5 µs with the class cached), and a window
    of the aggregator reads thousands of one-partition results: 27 % of its store thread's CPU
    in a profile. Rows keep attribute access (`row.applied`, `row.value`); a result's rows share
    one class, so do results with the same columns (a prepared statement's)."""
    return list(map(_row_class(tuple(colnames))._make, rows))


# Opening a connection includes the login: PasswordAuthenticator checks a bcrypt hash, which
# takes a loaded node well over the 2 s a request may take (an outbox relay exited at start on a
# busy 2-core box, "Failed to create connection pool"). Requests keep their short timeout.
CONNECT_TIMEOUT_S = 10.0
# What a service or worker process gives its Cassandra at start (still coming up, or too loaded to
# answer the control connection's schema queries) before it exits.
FIRST_CONNECT_S = 90.0


def cassandra(
    settings: Settings, request_timeout: float = 2.0, first_connect_s: float = 0.0
) -> tuple[Cluster, Session]:
    """A session on the likes keyspace as the services' role; requests time out fast so writes
    503 instead of hang. `first_connect_s`: how long a process starting before its Cassandra
    answers (or while it is too loaded to) retries the first connect instead of failing; the
    driver reconnects on its own after that. Tools and tests keep 0 (fail at once)."""

    def open_session() -> tuple[Cluster, Session]:
        profile = ExecutionProfile(
            load_balancing_policy=TokenAwarePolicy(
                DCAwareRoundRobinPolicy(local_dc=settings.cassandra_local_dc or "")
            ),
            request_timeout=request_timeout,
            row_factory=row_factory,
        )
        cluster = Cluster(
            settings.cassandra_hosts.split(","),
            port=settings.cassandra_port,
            execution_profiles={EXEC_PROFILE_DEFAULT: profile},
            connect_timeout=max(request_timeout, CONNECT_TIMEOUT_S),
            control_connection_timeout=CONNECT_TIMEOUT_S,
            protocol_version=5,
            # the driver's default backs off to 10 minutes: a node back after a restart would
            # stay unused for a minute or more
            reconnection_policy=ExponentialReconnectionPolicy(base_delay=0.5, max_delay=5.0),
            auth_provider=cassandra_auth(settings),
            ssl_context=cassandra_tls(settings),
        )
        try:
            return cluster, cluster.connect(settings.cassandra_keyspace)
        except Exception:
            cluster.shutdown()  # a failed first connect leaves a cluster that cannot connect again
            raise

    if first_connect_s <= 0:
        return open_session()
    retrying = Retrying(
        retry=retry_if_exception_type(NoHostAvailable),
        stop=stop_after_delay(first_connect_s),
        wait=wait_exponential(multiplier=0.5, max=5.0),
        before_sleep=lambda rs: log.warning(
            "cassandra not reachable yet; retrying",
            extra={"fields": {"attempt": rs.attempt_number}},
        ),
        reraise=True,
    )
    return retrying(open_session)


def cassandra_auth(settings: Settings) -> PlainTextAuthProvider | None:
    """The settings' login (the edge-store requires one); None: a server without auth."""
    if settings.cassandra_user is None or settings.cassandra_password is None:
        return None
    return PlainTextAuthProvider(
        settings.cassandra_user, settings.cassandra_password.get_secret_value()
    )


def cassandra_tls(settings: Settings) -> ssl.SSLContext | None:
    """TLS to the edge-store when the settings name the platform's CA: the chain is verified,
    the name is not (contracts/tls.py says why)."""
    if settings.tls_ca_file is None:
        return None
    return tls.cassandra_context(settings.tls_ca_file)


# The write path asks the registry only when its cached schema id is gone (a schema-cache-flush)
# and a user waits for the answer: no retry, so a registry that is down answers the write 503 +
# Retry-After at once (invariant 5) instead of after the client's default backoff (up to ~7 s;
# game day registry-503-on-publish: the writes' clients timed out). The client retries the
# write, with the same Idempotency-Key.
FAIL_FAST_REGISTRY_RETRIES = 0


def schema_registry(settings: Settings, *, retries: int | None = None) -> SchemaRegistryClient:
    """The registry, logged in with the settings' basic-auth user; `retries` as
    registry.client_config (None: the client's default, for the consumers, which can wait)."""
    return SchemaRegistryClient(registry.from_settings(settings, retries=retries))


def like_serializer(client: SchemaRegistryClient) -> AvroSerializer:
    """Writes with the schema compiled into this code, under the id the registry gave it at
    deploy time (services/schema/registry_schemas.py). No auto-registration: a schema nobody
    registered fails the write (the write path answers 503) instead of registering itself, and
    not use.latest.version: the latest registered version may be a newer deploy's."""
    return AvroSerializer(
        client,
        events.LIKE_EVENT_SCHEMA,
        to_dict=lambda e, _ctx: e.to_dict() if isinstance(e, events.LikeEvent) else e,
        conf={"auto.register.schemas": False, "use.latest.version": False},
    )


class LikeDeserializer:
    """Confluent's wire format (magic byte 0, the writer schema's registry id as 4 big-endian
    bytes, Avro binary) to a LikeEvent, resolving the writer's schema against ours as
    confluent-kafka's AvroDeserializer does, with the same decoder (fastavro), minus what that
    class does per message for features we do not use: data-contract rules, migrations between
    subject versions, and expanding the reader schema again for field transforms. Those were
    about two thirds of a decode, and a decode was 95 % of a bare consumer's CPU and 58 % of the
    aggregator's (py-spy of bench/bench_aggregator.py). A schema id never changes meaning, so a
    writer schema is fetched once per id. Framing other than the prefix (an id in the headers)
    is refused: our serializer never writes it."""

    def __init__(self, client: SchemaRegistryClient) -> None:
        self.client = client
        self.reader = fastavro.parse_schema(json.loads(events.LIKE_EVENT_SCHEMA))
        self._writers: dict[int, Any] = {}

    def __call__(self, data: bytes | None, _ctx: object = None) -> events.LikeEvent | None:
        if data is None:
            return None
        if len(data) <= 5 or data[0] != 0:
            raise SerializationError(
                f"not Confluent-framed Avro ({len(data)} bytes, magic byte {data[:1]!r})"
            )
        schema_id = int.from_bytes(data[1:5], "big")
        writer = self._writers.get(schema_id)
        if writer is None:  # SchemaRegistryError: the aggregator tells 404 from unreachable
            schema = self.client.get_schema(schema_id)
            if schema.schema_str is None or schema.schema_type not in (None, "AVRO"):
                raise SerializationError(f"schema {schema_id} is {schema.schema_type}, not Avro")
            writer = self._writers[schema_id] = fastavro.parse_schema(json.loads(schema.schema_str))
        record = fastavro.schemaless_reader(io.BytesIO(data[5:]), writer, self.reader)
        if not isinstance(record, dict):
            raise SerializationError(f"decoded to {type(record).__name__}, not a record")
        return events.LikeEvent.from_dict(record)

    def flush(self) -> None:
        """Forget every writer schema (the `schema-cache-flush` kill switch): the next message
        of each id fetches it from the registry again."""
        self._writers = {}
        self.client.clear_caches()


def like_deserializer(client: SchemaRegistryClient) -> LikeDeserializer:
    return LikeDeserializer(client)


def kafka_config(settings: Settings, **overrides: Any) -> dict[str, Any]:
    """Connection settings (bootstrap, SASL/SCRAM login) for any Producer, Consumer or
    AdminClient of ours, plus `overrides`."""
    return {**kafka.from_settings(settings), **overrides}


def end_offsets(conf: dict[str, Any], topic: str, timeout: float = 10.0) -> dict[int, int]:
    """`topic`'s end offset per partition, now (`conf`: kafka_config's); 0 for a partition that
    holds no message (never written, or all of it past retention): nothing there to consume."""
    c = Consumer({**conf, "group.id": "likes-end-offsets", "enable.auto.commit": False})
    try:  # metadata and watermarks only: the group never joins, never commits
        out = {}
        for p in c.list_topics(topic, timeout=timeout).topics[topic].partitions:
            low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
            out[p] = high if high > low else 0
        return out
    finally:
        c.close()


def committed_through(
    conf: dict[str, Any], group: str, topic: str, marks: dict[int, int], timeout: float = 10.0
) -> bool:
    """`group` has committed `topic` up to `marks` (partition -> offset, end_offsets' at some
    moment) in every partition: a consumer that commits after its work is done with everything
    the topic held then. A partition with nothing at its mark (0) has nothing to commit.
    Raises KafkaException when the coordinator does not answer."""
    c = Consumer({**conf, "group.id": group, "enable.auto.commit": False})
    try:
        got = c.committed([TopicPartition(topic, p) for p in marks], timeout=timeout)
    finally:
        c.close()
    return all(marks[tp.partition] == 0 or tp.offset >= marks[tp.partition] for tp in got)


def caught_up(conf: dict[str, Any], group: str, topic: str, timeout_s: float) -> bool:
    """Within `timeout_s`, `group` has committed everything `topic` holds at the call
    (end_offsets, then committed_through every 0.5 s; a coordinator that does not answer is
    asked again)."""
    marks = end_offsets(conf, topic)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(KafkaException):
            if committed_through(conf, group, topic, marks):
                return True
        time.sleep(0.5)
    return False


def producer(settings: Settings, **overrides: Any) -> Producer:
    """acks=all + idempotence: a broker loss neither loses nor duplicates an acked event."""
    conf: dict[str, Any] = {
        **kafka.from_settings(settings),
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": 2,
        "compression.type": "lz4",
        # librdkafka's own log lines go through Python logging (structured, leveled) instead
        # of raw stderr, where a broker outage would print one line per retry
        "logger": logging.getLogger("kafka.producer"),
    }
    conf.update(overrides)
    return Producer(conf)
