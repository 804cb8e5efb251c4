"""Durable state of the registry: a log of JSON records in a one-partition compacted Kafka topic.

The record format follows Confluent's `_schemas` topic (JSON keys carrying a `keytype`, JSON
values, null for a tombstone), and the in-memory view is rebuilt by replaying that log in order.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import avro.schema
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic

from local.schema_registry import compat
from services.contracts import kafka

log = logging.getLogger(__name__)

JSON = dict[str, Any]
Record = tuple[JSON, JSON | None]  # (key, value); value None is a tombstone
T = TypeVar("T")


class StoreError(Exception):
    """The backing store could not be read or did not acknowledge a write."""


class SchemaStore(Protocol):
    """An ordered, durable log of registry records."""

    def read_all(self) -> Iterator[Record]:
        """Every record from the beginning of the log up to its current end, in order."""
        ...

    def append(self, key: Mapping[str, Any], value: Mapping[str, Any] | None) -> None:
        """Write one record; returns only once it is durable, raises StoreError otherwise."""
        ...

    def close(self) -> None: ...


# -- record format --------------------------------------------------------------------------
# Keys are built with a fixed field order: compaction compares key bytes.


def _key_bytes(key: Mapping[str, Any]) -> bytes:
    return json.dumps(key, separators=(",", ":")).encode()


def schema_key(subject: str, version: int) -> JSON:
    return {"keytype": "SCHEMA", "subject": subject, "version": version, "magic": 1}


def config_key(subject: str | None) -> JSON:
    """`subject` None is the global config."""
    return {"keytype": "CONFIG", "subject": subject, "magic": 0}


# Not a Confluent key type. Ids must never be reused, but a hard delete tombstones the records
# that carry them and compaction then forgets the highest id; this record remembers it.
ID_HIGH_WATER_KEY: JSON = {"keytype": "ID_HIGH_WATER", "magic": 0}


@dataclass(frozen=True)
class SchemaVersion:
    """One version of one subject, as stored in its SCHEMA record."""

    subject: str
    version: int
    id: int
    schema: str
    deleted: bool = False

    def record(self) -> Record:
        value: JSON = {
            "subject": self.subject,
            "version": self.version,
            "id": self.id,
            "schema": self.schema,
            "deleted": self.deleted,
        }
        return schema_key(self.subject, self.version), value


class RegistryState:
    """The view the HTTP layer reads, built only by applying records (replayed or just written)."""

    def __init__(self) -> None:
        self.subjects: dict[str, dict[int, SchemaVersion]] = {}
        self.configs: dict[str | None, compat.Level] = {}
        self.max_id = 0
        self._schema_by_id: dict[int, str] = {}
        self._id_by_form: dict[str, int] = {}
        self._form_by_id: dict[int, str] = {}
        self._users: dict[int, set[tuple[str, int]]] = {}

    # -- applying records ----------------------------------------------------------------
    def apply(self, key: Mapping[str, Any], value: Mapping[str, Any] | None) -> None:
        keytype = key.get("keytype")
        try:
            if keytype == "SCHEMA":
                self._apply_schema(key, value)
            elif keytype == "CONFIG":
                self._apply_config(key, value)
            elif keytype == "ID_HIGH_WATER" and value is not None:
                self.max_id = max(self.max_id, int(value["maxId"]))
            # other key types (Confluent's NOOP, MODE, ...) carry nothing this registry uses
        except (KeyError, TypeError, ValueError) as e:
            # a foreign or damaged record must not stop the registry from starting
            log.warning("skipping malformed record %s -> %s: %s", key, value, e)

    def _apply_schema(self, key: Mapping[str, Any], value: Mapping[str, Any] | None) -> None:
        subject, version = str(key["subject"]), int(key["version"])
        versions = self.subjects.setdefault(subject, {})
        old = versions.pop(version, None)
        if old is not None:
            self._release(old)
        if value is not None:
            sv = SchemaVersion(
                subject=subject,
                version=version,
                id=int(value["id"]),
                schema=str(value["schema"]),
                deleted=bool(value.get("deleted", False)),
            )
            versions[version] = sv
            self._use(sv)
        if not versions:
            del self.subjects[subject]

    def _apply_config(self, key: Mapping[str, Any], value: Mapping[str, Any] | None) -> None:
        subject = key.get("subject")
        name = None if subject is None else str(subject)
        if value is None:
            self.configs.pop(name, None)
        else:
            self.configs[name] = compat.Level.parse(value["compatibilityLevel"])

    def _use(self, sv: SchemaVersion) -> None:
        self.max_id = max(self.max_id, sv.id)
        self._users.setdefault(sv.id, set()).add((sv.subject, sv.version))
        if sv.id not in self._schema_by_id:
            self._schema_by_id[sv.id] = sv.schema
            form = self._form(sv.schema)
            self._form_by_id[sv.id] = form
            self._id_by_form.setdefault(form, sv.id)

    def _release(self, sv: SchemaVersion) -> None:
        users = self._users.get(sv.id, set())
        users.discard((sv.subject, sv.version))
        if users:
            return
        # no subject refers to this id any more: the schema is gone (its id stays used)
        self._users.pop(sv.id, None)
        self._schema_by_id.pop(sv.id, None)
        form = self._form_by_id.pop(sv.id, None)
        if form is not None and self._id_by_form.get(form) == sv.id:
            del self._id_by_form[form]

    @staticmethod
    def _form(schema: str) -> str:
        try:
            return compat.canonical_form(compat.parse_schema(schema))
        except compat.InvalidSchema:
            return schema  # never written by this registry; identity by exact text then

    # -- queries -------------------------------------------------------------------------
    def versions(self, subject: str, deleted: bool = False) -> list[SchemaVersion]:
        """The subject's versions, oldest first; soft-deleted ones only if `deleted`."""
        found = self.subjects.get(subject, {})
        return [found[v] for v in sorted(found) if deleted or not found[v].deleted]

    def schema_text(self, schema_id: int) -> str | None:
        return self._schema_by_id.get(schema_id)

    def find(
        self, subject: str, schema: avro.schema.Schema, deleted: bool = False
    ) -> SchemaVersion | None:
        """The subject's first version whose schema is identical to `schema`, if any."""
        form = compat.canonical_form(schema)
        for sv in self.versions(subject, deleted=deleted):
            if self._form_by_id.get(sv.id) == form:
                return sv
        return None

    def id_for(self, schema: avro.schema.Schema) -> int | None:
        """The id already given to this schema (under any subject), if any."""
        return self._id_by_form.get(compat.canonical_form(schema))

    def usages(self, schema_id: int) -> list[SchemaVersion]:
        """Every (subject, version) registered with this id, soft-deleted ones included."""
        pairs = sorted(self._users.get(schema_id, set()))
        return [self.subjects[s][v] for s, v in pairs]

    def next_version(self, subject: str) -> int:
        return max(self.subjects.get(subject, {}), default=0) + 1


def replay(store: SchemaStore) -> RegistryState:
    state = RegistryState()
    for key, value in store.read_all():
        state.apply(key, value)
    return state


# -- Kafka ----------------------------------------------------------------------------------


class KafkaSchemaStore:
    """The registry's log in a one-partition compacted topic, created at first use if missing."""

    def __init__(
        self,
        bootstrap: str,
        topic: str = "_schemas",
        replication_factor: int | None = None,
        timeout: float = 30.0,
        login: kafka.Credentials | None = None,
        ca_file: str | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.replication_factor = replication_factor
        self.timeout = timeout
        self._common: JSON = {
            # the registry's own Kafka user (production's registry logs in the same way)
            **kafka.client_config(bootstrap, login, ca_file),
            "client.id": "schema-registry",
            # librdkafka's own messages into our log, not bare lines on stderr
            "logger": logging.getLogger("local.schema_registry.kafka"),
        }
        self._producer = Producer(
            {
                **self._common,
                # a registration is answered only once every in-sync replica has the record
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 0,
                "message.timeout.ms": int(timeout * 1000),
            }
        )
        self._topic_ready = False
        self._lock = threading.Lock()

    # -- topic ---------------------------------------------------------------------------
    def ensure_topic(self) -> None:
        """Create the topic if missing: RF min(3, brokers), min ISR min(2, RF), compacted."""
        if self._topic_ready:
            return
        admin = AdminClient(self._common)
        md = self._retry(lambda: admin.list_topics(timeout=5.0), "read cluster metadata")
        existing = md.topics.get(self.topic)
        if existing is not None and existing.error is None:
            if len(existing.partitions) != 1:
                raise StoreError(
                    f"topic {self.topic} has {len(existing.partitions)} partitions; the registry "
                    "needs exactly one to keep its records in order"
                )
        else:
            rf = self.replication_factor or min(3, len(md.brokers))
            config = {"cleanup.policy": "compact", "min.insync.replicas": str(min(2, rf))}
            log.info("creating topic %s (replication factor %d, %s)", self.topic, rf, config)
            futures = admin.create_topics([NewTopic(self.topic, 1, rf, config=config)])
            try:
                futures[self.topic].result(timeout=self.timeout)
            except KafkaException as e:
                if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise StoreError(f"cannot create topic {self.topic}: {e}") from e
        self._topic_ready = True

    def _retry(self, call: Callable[[], T], what: str) -> T:
        """Retry a Kafka call for `timeout` seconds: brokers may still be electing leaders."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                return call()
            except KafkaException as e:
                if time.monotonic() >= deadline:
                    raise StoreError(f"{what} from {self.bootstrap}: {e}") from e
                time.sleep(0.5)

    # -- reading -------------------------------------------------------------------------
    def read_all(self) -> Iterator[Record]:
        self.ensure_topic()
        consumer = Consumer(
            {
                **self._common,
                "group.id": "schema-registry",  # assign() only: nothing is ever committed
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "auto.offset.reset": "earliest",
            }
        )
        try:
            tp = TopicPartition(self.topic, 0)
            low, high = self._retry(
                lambda: consumer.get_watermark_offsets(tp, timeout=5.0), "read the end offset"
            )
            log.info("replaying %s offsets %d..%d", self.topic, low, high)
            if high <= low:
                return
            consumer.assign([TopicPartition(self.topic, 0, OFFSET_BEGINNING)])
            yield from self._consume_until(consumer, high)
        finally:
            consumer.close()

    def _consume_until(self, consumer: Consumer, high: int) -> Iterator[Record]:
        last_progress = time.monotonic()
        while True:
            msg = consumer.poll(0.5)
            if msg is None:
                if time.monotonic() - last_progress > self.timeout:
                    raise StoreError(f"no progress reading {self.topic} towards offset {high}")
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    if (msg.offset() or 0) >= high:
                        return
                    continue
                raise StoreError(f"reading {self.topic}: {err}")
            last_progress = time.monotonic()
            record = self._decode(msg)
            if record is not None:
                yield record
            if (msg.offset() or 0) >= high - 1:
                return

    @staticmethod
    def _decode(msg: Message) -> Record | None:
        try:
            raw_key, raw_value = msg.key(), msg.value()
            key = json.loads(raw_key) if raw_key is not None else None
            value = json.loads(raw_value) if raw_value is not None else None
        except ValueError as e:
            log.warning("skipping non-JSON record at offset %s: %s", msg.offset(), e)
            return None
        if not isinstance(key, dict) or not (value is None or isinstance(value, dict)):
            log.warning("skipping record at offset %s: not a JSON object", msg.offset())
            return None
        return key, value

    # -- writing -------------------------------------------------------------------------
    def append(self, key: Mapping[str, Any], value: Mapping[str, Any] | None) -> None:
        self.ensure_topic()
        done = threading.Event()
        errors: list[str] = []

        def on_delivery(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:
                errors.append(str(err))
            done.set()

        payload = None if value is None else json.dumps(value, separators=(",", ":")).encode()
        with self._lock:
            try:
                self._producer.produce(
                    self.topic,
                    key=_key_bytes(key),
                    value=payload,
                    partition=0,
                    on_delivery=on_delivery,
                )
            except (BufferError, KafkaException) as e:
                raise StoreError(f"cannot write to {self.topic}: {e}") from e
            # librdkafka always reports a message within message.timeout.ms; the margin is for
            # the callback itself
            deadline = time.monotonic() + self.timeout + 5.0
            while not done.is_set() and time.monotonic() < deadline:
                self._producer.poll(0.1)
        if not done.is_set():
            raise StoreError(f"write to {self.topic} not acknowledged in {self.timeout:.0f}s")
        if errors:
            raise StoreError(f"write to {self.topic} failed: {errors[0]}")

    def close(self) -> None:
        self._producer.flush(self.timeout)
