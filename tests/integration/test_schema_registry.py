"""The local schema registry against the real stack, driven by confluent-kafka's own client and
Avro serdes, exactly as the services use it."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from confluent_kafka.admin import AdminClient, ConfigResource
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext, SerializationError

from services.contracts import clients, events
from services.schema import registry_schemas
from tests.conftest import Stack

pytestmark = pytest.mark.stack

MEDIA_TYPE = "application/vnd.schemaregistry.v1+json"


def avro(*fields: dict[str, Any], indent: int | None = None) -> Schema:
    doc = {"type": "record", "name": "Liked", "namespace": "likes.test", "fields": list(fields)}
    return Schema(json.dumps(doc, indent=indent), "AVRO")


POST_ID = {"name": "post_id", "type": "string"}
USER_ID = {"name": "user_id", "type": "string"}
REACTION = {"name": "reaction", "type": "string", "default": "like"}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def registry(stack: Stack) -> Iterator[SchemaRegistryClient]:
    client = stack.registry_client()
    yield client
    client.close()


def test_schemas_topic_is_one_compacted_partition(stack: Stack) -> None:
    admin = AdminClient(stack.kafka_config())
    topic = admin.list_topics("_schemas", timeout=10).topics["_schemas"]
    assert topic.error is None
    assert len(topic.partitions) == 1
    rf = min(3, stack.layout.kafka_brokers)
    assert len(topic.partitions[0].replicas) == rf
    resource = ConfigResource("topic", "_schemas")
    config = admin.describe_configs([resource])[resource].result(timeout=10)
    assert config["cleanup.policy"].value == "compact"
    assert config["min.insync.replicas"].value == str(min(2, rf))


def test_register_read_back_and_reregister(registry: SchemaRegistryClient) -> None:
    subject = unique("team/liked")  # a '/' travels as %2F and stays one subject
    schema = avro(POST_ID, USER_ID)
    schema_id = registry.register_schema(subject, schema)

    latest = registry.get_latest_version(subject)
    assert (latest.subject, latest.version, latest.schema_id) == (subject, 1, schema_id)
    assert json.loads(registry.get_schema(schema_id).schema_str or "") == json.loads(
        schema.schema_str or ""
    )
    assert subject in registry.get_subjects()
    assert registry.lookup_schema(subject, schema).version == 1

    # the same schema, formatted differently: same id, no new version (a fresh client has no
    # cache that could answer instead of the registry)
    fresh = SchemaRegistryClient(dict(registry.config()))
    try:
        assert fresh.register_schema(subject, avro(POST_ID, USER_ID, indent=2)) == schema_id
        assert fresh.get_versions(subject) == [1]
        # ids are global: another subject with the same schema gets the same id
        assert fresh.register_schema(unique("other"), schema) == schema_id
    finally:
        fresh.close()


def test_forward_rejects_incompatible_and_accepts_compatible(
    registry: SchemaRegistryClient,
) -> None:
    subject = unique("forward")
    registry.set_compatibility(subject, "FORWARD")
    assert registry.get_compatibility(subject) == "FORWARD"
    v1 = registry.register_schema(subject, avro(POST_ID, USER_ID))

    # readers of version 1 need user_id, which has no default: data without it breaks them
    dropped = avro(POST_ID)
    assert registry.test_compatibility(subject, dropped) is False
    with pytest.raises(SchemaRegistryError) as rejected:
        registry.register_schema(subject, dropped)
    assert rejected.value.http_status_code == 409
    assert rejected.value.error_code in (409, 40901)  # Confluent 7.x / 8.x
    assert registry.get_versions(subject) == [1]

    # an added field is invisible to old readers
    added = avro(POST_ID, USER_ID, REACTION)
    assert registry.test_compatibility(subject, added) is True
    v2 = registry.register_schema(subject, added)
    assert v2 != v1
    assert registry.get_versions(subject) == [1, 2]


def test_errors_carry_confluent_codes(stack: Stack, registry: SchemaRegistryClient) -> None:
    subject = unique("errors")
    cases: list[tuple[Any, int, int]] = [
        (lambda: registry.get_version(subject, 1), 404, 40401),
        (lambda: registry.get_schema(2**31 - 1), 404, 40403),
        (lambda: registry.register_schema(subject, Schema('{"type": "nope"}', "AVRO")), 422, 42201),
        (lambda: registry.set_compatibility(subject, "sideways"), 422, 42203),
        (lambda: registry.get_compatibility(subject), 404, 40408),
    ]
    for call, status, code in cases:
        with pytest.raises(SchemaRegistryError) as err:
            call()
        assert (err.value.http_status_code, err.value.error_code) == (status, code)

    registry.register_schema(subject, avro(POST_ID))
    with pytest.raises(SchemaRegistryError) as err:
        registry.get_version(subject, 7)
    assert err.value.error_code == 40402
    with pytest.raises(SchemaRegistryError) as err:
        registry.lookup_schema(subject, avro(USER_ID))
    assert err.value.error_code == 40403

    # bad input is a 4xx with Confluent's body and content type, never a 500
    r = httpx.post(
        f"{stack.registry_url}/subjects/{subject}/versions",
        content=b"{not json",
        headers={"Content-Type": MEDIA_TYPE},
        auth=(stack.registry_login.user, stack.registry_login.password),
        verify=stack.registry_verify,
    )
    assert r.status_code == 400
    assert r.headers["content-type"].startswith(MEDIA_TYPE)
    assert set(r.json()) == {"error_code", "message"}


def test_avro_serde_round_trip_in_wire_format(registry: SchemaRegistryClient) -> None:
    topic = unique("likes.test")
    schema = avro(POST_ID, USER_ID, REACTION)
    serializer = AvroSerializer(registry, schema.schema_str)
    deserializer = AvroDeserializer(registry)
    ctx = SerializationContext(topic, MessageField.VALUE)
    event = {"post_id": "p-1", "user_id": "u-1", "reaction": "love"}

    data = serializer(event, ctx)
    assert data is not None
    # no association is known, so the client falls back to the `{topic}-value` subject
    registered = registry.get_latest_version(f"{topic}-value")
    assert data[0] == 0
    assert int.from_bytes(data[1:5], "big") == registered.schema_id
    assert deserializer(data, ctx) == event


@pytest.mark.disruptive
def test_restart_keeps_subjects_versions_ids_and_levels(
    stack: Stack, registry: SchemaRegistryClient
) -> None:
    subject, twin = unique("restart"), unique("restart-twin")
    registry.set_compatibility(subject, "FULL_TRANSITIVE")
    first = registry.register_schema(subject, avro(POST_ID))
    second = registry.register_schema(subject, avro(POST_ID, REACTION))
    assert registry.register_schema(twin, avro(POST_ID)) == first

    assert stack.supervisor.stop("schema-registry")
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{stack.registry_url}/subjects", timeout=2, verify=stack.registry_verify)
    stack.up()

    after = stack.registry_client()  # nothing cached
    try:
        assert {subject, twin} <= set(after.get_subjects())
        assert after.get_versions(subject) == [1, 2]
        assert after.get_version(subject, 1).schema_id == first
        assert after.get_version(subject, 2).schema_id == second
        assert after.get_version(twin, 1).schema_id == first
        assert json.loads(after.get_schema(second).schema_str or "")["fields"][1]["name"] == (
            "reaction"
        )
        assert after.get_compatibility(subject) == "FULL_TRANSITIVE"
        # ids keep counting after a restart: a new schema never reuses one
        new_id = after.register_schema(unique("restart-new"), avro(USER_ID))
        assert new_id > second
    finally:
        after.close()


def test_a_producer_never_registers_a_schema(stack: Stack, registry: SchemaRegistryClient) -> None:
    """The services' serializer runs with auto.register.schemas off: on a subject the deploy
    step did not register, a write fails with the registry's 'not found', and nothing is
    registered behind anyone's back."""
    topic = unique("likes.unregistered")
    serialize = clients.like_serializer(registry)
    event = events.LikeEvent.new(
        intent_uuid=str(uuid.uuid4()), user_id="u", post_id="p", action="like",
        reaction="like", delta=1, region="local",
    )  # fmt: skip
    with pytest.raises(SchemaRegistryError) as refused:
        serialize(event, SerializationContext(topic, MessageField.VALUE))
    assert refused.value.http_status_code == 404
    assert refused.value.error_code in (40401, 40403)
    assert f"{topic}-value" not in registry.get_subjects()
    # the event topics' subjects are registered (by the deploy step): the same serializer writes
    data = serialize(event, SerializationContext(events.COMMITTED, MessageField.VALUE))
    assert data is not None
    deserialize = clients.like_deserializer(registry)
    assert deserialize(data, SerializationContext(events.COMMITTED, MessageField.VALUE)) == event
    # what the aggregator tells apart: bad framing and an id no registry knows are the
    # message's fault (poison); an unreachable registry is not (SchemaRegistryError 5xx, OSError)
    with pytest.raises(SerializationError, match="not Confluent-framed"):
        deserialize(b"\x01" + data[1:])
    with pytest.raises(SchemaRegistryError) as unknown:
        deserialize(b"\x00" + (2**31 - 1).to_bytes(4, "big") + data[5:])
    assert unknown.value.http_status_code == 404


def test_the_registration_step_is_idempotent(registry: SchemaRegistryClient) -> None:
    """`likes local up` (and production's Job) ran it already: a rerun changes nothing."""
    assert registry_schemas.apply(registry, registry_schemas.subjects()) == []
    for subject in registry_schemas.subjects():
        assert registry.get_compatibility(subject) == registry_schemas.COMPATIBILITY
