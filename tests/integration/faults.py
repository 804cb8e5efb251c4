"""Small pieces the fault tests share (the alert tests, the consumer-lag tests)."""

from __future__ import annotations

import uuid

from confluent_kafka import Producer
from confluent_kafka.serialization import MessageField, SerializationContext

from services.contracts import clients, events, keys
from tests.conftest import Stack


def produce_like(stack: Stack) -> int:
    """One like event of a new post on likes.committed, as the write path publishes it;
    returns its partition. A stopped aggregator's lag then grows with the clock."""
    settings = stack.settings()
    ser = clients.like_serializer(clients.schema_registry(settings))
    post = f"post-{uuid.uuid4()}"
    e = events.LikeEvent.new(intent_uuid=str(uuid.uuid4()), user_id=f"u-{uuid.uuid4().hex[:6]}",
                             post_id=post, action="like", reaction="like", delta=1,
                             region=settings.region, shard=0)  # fmt: skip
    value = ser(e, SerializationContext(events.COMMITTED, MessageField.VALUE))
    partition: list[int] = []
    p = Producer(stack.kafka_config())
    p.produce(events.COMMITTED, key=keys.kafka_key(post, 0).encode(), value=value,
              on_delivery=lambda _err, m: partition.append(m.partition()))  # fmt: skip
    assert p.flush(30) == 0 and len(partition) == 1
    return partition[0]
