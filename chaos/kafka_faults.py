"""Data and broker faults on the real Kafka, shared by the game days (chaos/actions.py) and the
fault tests (tests/integration/faults.py). Each takes a client's connection settings
(services/contracts/kafka.client_config)."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from confluent_kafka import ElectionType, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from services.contracts import events

POISON_PREFIX = "poison-"  # the key of every poison message: `likes dlq` lists them by it


def produce_poison(config: dict[str, Any], n: int = 1, topic: str = events.COMMITTED) -> list[str]:
    """`n` messages on `topic` that no consumer can decode (no Avro, no registry header): each
    one the aggregator dead-letters. Their keys, in order."""
    p = Producer(config)
    keys = []
    for i in range(n):
        key = f"{POISON_PREFIX}{uuid.uuid4()}"
        p.produce(topic, key=key.encode(), value=b"\x00 not Avro: a fault's poison " + b"%d" % i)
        keys.append(key)
        if i % 1000 == 999:
            p.flush(30)
    left = p.flush(30)
    if left:
        raise RuntimeError(f"{left} poison messages were not delivered to {topic}")
    return keys


def set_records_refused(config: dict[str, Any], topics: list[str], refused: bool) -> None:
    """The brokers refuse every record written to `topics` (or accept them again): the topics'
    max.message.bytes is set below the size of any record batch (or back to the brokers'
    default), so a producer's send fails with MSG_SIZE_TOO_LARGE and, on __consumer_offsets, a
    group's offset commit with INVALID_COMMIT_OFFSET_SIZE. What clients see is a topic no one can
    write to, as when too few replicas are in sync, but only on these topics: reads and every
    other topic go on. Accepting again is idempotent."""
    admin = AdminClient(config)
    op = AlterConfigOpType.SET if refused else AlterConfigOpType.DELETE
    entry = ConfigEntry("max.message.bytes", "1", incremental_operation=op)
    resources = [ConfigResource(ResourceType.TOPIC, t, incremental_configs=[entry]) for t in topics]
    for done in admin.incremental_alter_configs(resources).values():
        done.result(30)
    if refused:
        # the controller accepted it; each broker applies it from the metadata log a moment later
        time.sleep(1)


@contextmanager
def records_refused(config: dict[str, Any], *topics: str) -> Iterator[None]:
    """`set_records_refused` for the block's duration."""
    set_records_refused(config, list(topics), True)
    try:
        yield
    finally:
        set_records_refused(config, list(topics), False)


def prefer_leaders(config: dict[str, Any], topics: list[str], timeout_s: float = 30.0) -> int:
    """Every partition of `topics` led by its preferred replica (the first of its assignment), as
    a cluster that has been up a while is (the brokers rebalance leaders every 5 minutes): after
    a restart the broker that came up first leads nearly everything, and a fault aimed at one
    broker would hit all or none of the traffic. Returns the partitions not led by their
    preferred replica at the end (0: all are)."""
    admin = AdminClient(config)
    deadline = time.monotonic() + timeout_s
    while True:
        md = admin.list_topics(timeout=10)
        off = [
            TopicPartition(t, p.id)
            for t in topics
            for p in md.topics[t].partitions.values()
            if p.replicas and p.leader != p.replicas[0]
        ]
        if not off or time.monotonic() >= deadline:
            return len(off)
        # ELECTION_NOT_NEEDED, or a replica not in sync yet: look again
        with contextlib.suppress(KafkaException):
            admin.elect_leaders(ElectionType.PREFERRED, off).result(10)
        time.sleep(1)
