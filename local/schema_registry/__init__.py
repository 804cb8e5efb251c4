"""A compact, Confluent-compatible schema registry for the local stack (Avro only), storing its
state in the `_schemas` Kafka topic; production uses Confluent Schema Registry."""

from local.schema_registry.app import create_app
from local.schema_registry.compat import Level, Verdict, check
from local.schema_registry.store import KafkaSchemaStore, SchemaStore

__all__ = ["KafkaSchemaStore", "Level", "SchemaStore", "Verdict", "check", "create_app"]
