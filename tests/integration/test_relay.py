"""The outbox relay's marker decisions on the real edge-store and Kafka: a stale marker without
its outbox row is dropped, one whose row exists (a batch that applied after its client gave up)
is published; the drop goes through a SERIAL read of the user's partition (review D1)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from cassandra.cluster import Session
from confluent_kafka.serialization import MessageField, SerializationContext

from services.contracts import clients, events, keys
from services.relay.core import OutboxRelay
from services.write.core import Publisher, outbox_shard
from tests.conftest import Stack
from tests.integration.test_write import events_for, outbox_rows

pytestmark = pytest.mark.stack


def marker(cql: Session, user: str, event_id: uuid.UUID, created: datetime) -> tuple[int, int]:
    bucket, shard = int(created.timestamp() // 60), outbox_shard(user)
    cql.execute(
        "INSERT INTO outbox_pending (bucket, shard, created_at, event_id, user_id) "
        "VALUES (%s, %s, %s, %s, %s)",
        (bucket, shard, created, event_id, user),
    )
    return bucket, shard


def markers_of(cql: Session, bucket: int, shard: int, event_id: uuid.UUID) -> int:
    rows = cql.execute(
        "SELECT event_id FROM outbox_pending WHERE bucket = %s AND shard = %s", (bucket, shard)
    )
    return sum(1 for r in rows if r.event_id == event_id)


def test_a_stale_marker_is_dropped_without_a_row_and_published_with_one(
    stack: Stack, cql: Session
) -> None:
    stack.cli("local", "stop", "outbox-relay")  # the stack's relay would race ours for them
    try:
        _drop_and_publish(stack, cql)
    finally:
        stack.up()


def _drop_and_publish(stack: Stack, cql: Session) -> None:
    settings = stack.settings()
    created = datetime.now(UTC) - timedelta(seconds=45)  # older than the write timeout
    # 1. a batch that never applied: no outbox row
    lost_user, lost_event = f"u-{uuid.uuid4()}", uuid.uuid4()
    lost_at = marker(cql, lost_user, lost_event, created)
    # 2. a batch that applied after its client saw a timeout: the row is there, unpublished
    user, post, intent = f"u-{uuid.uuid4()}", f"p-{uuid.uuid4()}", str(uuid.uuid4())
    ev = events.LikeEvent.new(
        intent_uuid=intent, user_id=user, post_id=post, action="like", reaction="like",
        delta=1, region=settings.region, shard=0,
    )  # fmt: skip
    ser = clients.like_serializer(clients.schema_registry(settings))
    payload = ser(ev, SerializationContext(events.COMMITTED, MessageField.VALUE))
    cql.execute(
        "INSERT INTO edges (user_id, kind, ref, post_id, topic, kafka_key, payload, created_at, "
        "published, intent_uuid) VALUES (%s, 'outbox', %s, %s, %s, %s, %s, %s, false, %s)",
        (user, ev.event_id, post, events.COMMITTED, keys.kafka_key(post, 0), payload, created,
         uuid.UUID(intent)),
    )  # fmt: skip
    late_at = marker(cql, user, uuid.UUID(ev.event_id), created)

    cluster, session = clients.cassandra(settings)
    publisher = Publisher(clients.producer(settings))
    try:
        relay = OutboxRelay(session, publisher)
        res = relay.run_once()
    finally:
        publisher.close()
        cluster.shutdown()
    assert res.dropped_markers >= 1 and res.published >= 1
    assert markers_of(cql, *lost_at, lost_event) == 0
    assert markers_of(cql, *late_at, uuid.UUID(ev.event_id)) == 0
    assert outbox_rows(cql, user) == []
    assert [e.event_id for e in events_for(stack, {intent}, want=1)] == [ev.event_id]
