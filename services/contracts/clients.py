"""One factory per store, configured from Settings, so every service talks to them the same way."""

from __future__ import annotations

import logging
from typing import Any

from cassandra import DriverException
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import (
    EXEC_PROFILE_DEFAULT,
    Cluster,
    ExecutionProfile,
    NoHostAvailable,
    Session,
)
from cassandra.connection import OperationTimedOut
from cassandra.policies import (
    DCAwareRoundRobinPolicy,
    ExponentialReconnectionPolicy,
    TokenAwarePolicy,
)
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import RedisClusterException, RedisError

from services.contracts import events
from services.contracts.settings import Settings


def count_cache(settings: Settings, timeout: float = 0.5) -> RedisCluster:
    """The count-cache cluster. Short timeouts: a read falls through rather than waits."""
    return RedisCluster(
        startup_nodes=[ClusterNode(h, p) for h, p in settings.count_cache_startup],
        password=settings.redis_auth,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        decode_responses=True,
        cluster_error_retry_attempts=1,
    )


def idem_store(settings: Settings, timeout: float = 0.5) -> RedisCluster:
    """The idempotency store: a Redis Cluster with AOF, as the program declares it. A shard
    that is down fails its own keys (closed: 503), not the others'."""
    return RedisCluster(
        startup_nodes=[ClusterNode(h, p) for h, p in settings.idem_store_startup],
        password=settings.redis_auth,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        decode_responses=True,
        cluster_error_retry_attempts=1,
    )


# everything a Redis Cluster client raises when a request cannot be served: a cluster it cannot
# reach at all raises RedisClusterException, which is not a RedisError
REDIS_ERRORS: tuple[type[Exception], ...] = (RedisError, RedisClusterException)


# everything the driver raises when a request cannot be served: answer 503 / degrade on these
CASSANDRA_ERRORS: tuple[type[Exception], ...] = (
    DriverException,
    NoHostAvailable,
    OperationTimedOut,
)


def cassandra(settings: Settings, request_timeout: float = 2.0) -> tuple[Cluster, Session]:
    """A session on the likes keyspace as the services' role; requests time out fast so writes
    503 instead of hang."""
    profile = ExecutionProfile(
        load_balancing_policy=TokenAwarePolicy(
            DCAwareRoundRobinPolicy(local_dc=settings.cassandra_local_dc or "")
        ),
        request_timeout=request_timeout,
    )
    cluster = Cluster(
        settings.cassandra_hosts.split(","),
        port=settings.cassandra_port,
        execution_profiles={EXEC_PROFILE_DEFAULT: profile},
        connect_timeout=request_timeout,
        protocol_version=5,
        # the driver's default backs off to 10 minutes: a node back after a restart would stay
        # unused for a minute or more
        reconnection_policy=ExponentialReconnectionPolicy(base_delay=0.5, max_delay=5.0),
        auth_provider=cassandra_auth(settings),
    )
    return cluster, cluster.connect(settings.cassandra_keyspace)


def cassandra_auth(settings: Settings) -> PlainTextAuthProvider | None:
    """The settings' login (the edge-store requires one); None: a server without auth."""
    if settings.cassandra_user is None or settings.cassandra_password is None:
        return None
    return PlainTextAuthProvider(
        settings.cassandra_user, settings.cassandra_password.get_secret_value()
    )


def schema_registry(settings: Settings) -> SchemaRegistryClient:
    return SchemaRegistryClient({"url": settings.schema_registry_url, "timeout": 2})


def like_serializer(registry: SchemaRegistryClient) -> AvroSerializer:
    # auto-register: the first producer of a new schema version registers it, and the registry's
    # FORWARD check rejects an incompatible one at publish time
    return AvroSerializer(
        registry,
        events.LIKE_EVENT_SCHEMA,
        to_dict=lambda e, _ctx: e.to_dict() if isinstance(e, events.LikeEvent) else e,
        conf={"auto.register.schemas": True},
    )


def like_deserializer(registry: SchemaRegistryClient) -> AvroDeserializer:
    return AvroDeserializer(
        registry,
        events.LIKE_EVENT_SCHEMA,
        from_dict=lambda d, _ctx: events.LikeEvent.from_dict(d),
    )


def producer(settings: Settings, **overrides: Any) -> Producer:
    """acks=all + idempotence: a broker loss neither loses nor duplicates an acked event."""
    conf: dict[str, Any] = {
        "bootstrap.servers": settings.kafka_bootstrap,
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
