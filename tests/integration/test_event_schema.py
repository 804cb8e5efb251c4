"""The like event under FORWARD compatibility: the next version stays readable by consumers still
on this one, and a change that would break them is refused by the registry at publish time."""

from __future__ import annotations

import json
import uuid

import pytest
from confluent_kafka.schema_registry import Schema
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext

from services.contracts import events
from tests.conftest import Stack

pytestmark = pytest.mark.stack


def v1() -> dict[str, object]:
    schema: dict[str, object] = json.loads(events.LIKE_EVENT_SCHEMA)
    return schema


def with_fields(fields: list[dict[str, object]]) -> str:
    return json.dumps({**v1(), "fields": fields})


def test_next_version_is_readable_by_consumers_on_this_one(stack: Stack) -> None:
    registry = stack.registry_client()
    subject = f"likes.schema-test-{uuid.uuid4().hex[:8]}-value"
    topic = subject.removesuffix("-value")
    registry.set_compatibility(subject, "FORWARD")
    registry.register_schema(subject, Schema(events.LIKE_EVENT_SCHEMA, "AVRO"))

    # v2 adds a field (with a default, as a good citizen) — old readers just skip it
    fields = list(v1()["fields"])  # type: ignore[call-overload]
    v2 = with_fields([*fields, {"name": "client", "type": "string", "default": "unknown"}])
    registry.register_schema(subject, Schema(v2, "AVRO"))

    ser = AvroSerializer(
        registry, v2, conf={"auto.register.schemas": False, "use.latest.version": True}
    )
    record = {
        "event_id": str(uuid.uuid4()), "intent_uuid": str(uuid.uuid4()), "user_id": "u",
        "post_id": "p", "action": "like", "reaction": "like", "delta": 1, "region": "local",
        "shard": 0, "occurred_at": 1_700_000_000_000, "client": "ios",
    }  # fmt: skip
    ctx = SerializationContext(topic, MessageField.VALUE)
    payload = ser(record, ctx)
    assert payload is not None

    # a consumer still compiled against v1 (its reader schema) reads the v2 bytes
    old_reader = AvroDeserializer(
        registry, events.LIKE_EVENT_SCHEMA, from_dict=lambda d, _c: events.LikeEvent.from_dict(d)
    )
    ev = old_reader(payload, ctx)
    assert ev.intent_uuid == record["intent_uuid"] and ev.delta == 1

    # v3 drops intent_uuid, which v1 readers need and has no default: refused at the source
    broken = with_fields([f for f in fields if f["name"] != "intent_uuid"])
    with pytest.raises(SchemaRegistryError) as e:
        registry.register_schema(subject, Schema(broken, "AVRO"))
    assert e.value.http_status_code == 409


def test_the_abuse_signals_are_a_forward_evolution_of_the_event_before_them(
    stack: Stack,
) -> None:
    """Issue 13: client_ip, device and account_created came to the like event as optional
    fields. Through the stack's registry under FORWARD: the event as it was before them, then
    as it is, is accepted; a consumer still on the old reader schema reads an event with
    signals, and ours reads an event written before them (signals None)."""
    from services.contracts import clients

    registry = stack.registry_client()
    subject = f"likes.signals-test-{uuid.uuid4().hex[:8]}-value"
    topic = subject.removesuffix("-value")
    fields = list(v1()["fields"])  # type: ignore[call-overload]
    before = with_fields([f for f in fields if f["name"] not in events.OPTIONAL_FIELDS])
    assert len(json.loads(before)["fields"]) == len(fields) - len(events.OPTIONAL_FIELDS)
    registry.set_compatibility(subject, "FORWARD")
    old_id = registry.register_schema(subject, Schema(before, "AVRO"))
    new_id = registry.register_schema(subject, Schema(events.LIKE_EVENT_SCHEMA, "AVRO"))
    assert new_id != old_id

    ctx = SerializationContext(topic, MessageField.VALUE)
    e = events.LikeEvent.new(
        intent_uuid=str(uuid.uuid4()), user_id="u", post_id="p", action="like",
        reaction="like", delta=1, region="local", client_ip="192.0.2.7", device="dev-1",
        account_created=1_700_000_000_000,
    )  # fmt: skip
    conf = {"auto.register.schemas": False, "use.latest.version": True}
    serialize = AvroSerializer(
        registry, events.LIKE_EVENT_SCHEMA, to_dict=lambda ev, _c: ev.to_dict(), conf=conf
    )
    with_signals = serialize(e, ctx)
    assert with_signals is not None and int.from_bytes(with_signals[1:5], "big") == new_id
    old_reader = AvroDeserializer(registry, before)  # a consumer built before the signals
    seen = old_reader(with_signals, ctx)
    assert seen is not None and not set(events.OPTIONAL_FIELDS) & set(seen)
    assert {k: seen[k] for k in ("intent_uuid", "post_id", "delta")} == {
        "intent_uuid": e.intent_uuid, "post_id": "p", "delta": 1,
    }  # fmt: skip

    # an event written before the signals, read by the workloads' own deserializer
    old = {k: v for k, v in e.to_dict().items() if k not in events.OPTIONAL_FIELDS}
    old_bytes = AvroSerializer(registry, before,
                               conf={"auto.register.schemas": False})(old, ctx)  # fmt: skip
    assert old_bytes is not None and int.from_bytes(old_bytes[1:5], "big") == old_id
    ours = clients.like_deserializer(registry)(old_bytes, ctx)
    assert ours is not None and ours.intent_uuid == e.intent_uuid
    assert (ours.client_ip, ours.device, ours.account_created) == (None, None, None)
