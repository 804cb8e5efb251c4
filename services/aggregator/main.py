"""Wiring: clients from settings, the purger, the ops HTTP server; `build()` is shared by
`python -m services.aggregator`, the tests and the benchmark."""

from __future__ import annotations

import logging
from typing import Any

from cassandra.cluster import Cluster
from confluent_kafka import Consumer

from services.aggregator.cache import AggregateWriter, HotPoolMirror
from services.aggregator.dlq import DeadLetter
from services.aggregator.purge import (
    BackgroundPurger,
    CloudflarePurger,
    NullPurger,
    Purger,
    RecordingPurger,
)
from services.aggregator.settings import AggregatorSettings
from services.aggregator.store import CounterStore
from services.aggregator.worker import Aggregator
from services.contracts import clients

log = logging.getLogger("aggregator")


def consumer_config(s: AggregatorSettings, **overrides: Any) -> dict[str, Any]:
    conf: dict[str, Any] = {
        **clients.kafka_config(s),
        "group.id": s.agg_group_id,
        "enable.auto.commit": False,  # offsets move only after a window's writes succeeded
        "enable.auto.offset.store": False,
        "auto.offset.reset": s.agg_auto_offset_reset,
        # eager range assignment: partition n of every topic moves together, and on_assign
        # can seek each partition back for the dedup warm-up before anything is consumed
        "partition.assignment.strategy": "range",
        "session.timeout.ms": 10000,
        "heartbeat.interval.ms": 3000,
        "max.poll.interval.ms": 300000,
    }
    conf.update(overrides)
    return conf


def make_purger(s: AggregatorSettings, rc: Any) -> Purger:
    if s.cdn_purger == "cloudflare":
        # retried calls to a remote API: never on the consumer loop's thread
        return BackgroundPurger(
            CloudflarePurger(
                s.cloudflare_zone_id,
                s.cloudflare_api_token.get_secret_value(),
                s.cloudflare_api_url,
            )
        )
    if s.cdn_purger == "recording":
        return RecordingPurger(rc)
    return NullPurger()


def build(s: AggregatorSettings, **consumer_overrides: Any) -> tuple[Aggregator, Cluster]:
    """An Aggregator on fresh clients; the caller runs it and shuts the Cluster down after."""
    cluster, session = clients.cassandra(
        s, request_timeout=10.0, first_connect_s=clients.FIRST_CONNECT_S
    )
    rc = clients.count_cache(s, timeout=2.0)
    registry = clients.schema_registry(s)
    agg = Aggregator(
        s,
        consumer=Consumer(consumer_config(s, **consumer_overrides)),
        deserialize=clients.like_deserializer(registry),
        store=CounterStore(session, s.agg_store_concurrency),
        cache=AggregateWriter(rc, s.agg_cache_ttl_s),
        purger=make_purger(s, rc),
        dead_letter=DeadLetter(clients.producer(s), s.dead_letter_topic, group=s.agg_group_id),
        mirror=HotPoolMirror(s.hot_pool_addresses, s.redis_auth)
        if s.agg_always_replicate and s.hot_pools
        else None,
    )
    return agg, cluster
