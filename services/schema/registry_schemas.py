"""Register the repository's Avro schemas (services/contracts/avro/*.avsc) with the compatibility
the platform declares, idempotently: the deploy step producers depend on, since they run with
`auto.register.schemas` off and write only with a schema registered here.

Shared by the local stack's bootstrap and production's schema-registration Job (`python -m
services.schema.registry_schemas`, the registry's address and login from the LIKES_* variables
the workloads get, the password from a Secret, never argv). Registering a schema identical to an
existing version returns that version: a rerun changes nothing. An incompatible schema is refused
by the registry (409) and fails the step, before any producer writes with it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from services.contracts import events

AVRO_DIR = events.AVRO_DIR
COMPATIBILITY = "FORWARD"  # events written with a new schema stay readable by old consumers
# Which topics' values each schema file describes (TopicNameStrategy: `<topic>-value`). A file
# not listed here registers under its record's full name.
TOPICS_BY_SCHEMA: dict[str, tuple[str, ...]] = {"like_event": events.EVENT_TOPICS}


class RegistrationError(Exception):
    """The registry refused a schema or a compatibility level."""


def subjects(
    avro_dir: Path = AVRO_DIR,
    topics_by_schema: Mapping[str, Sequence[str]] = TOPICS_BY_SCHEMA,
) -> dict[str, str]:
    """subject -> schema text for every .avsc file; empty when there are none yet."""
    out: dict[str, str] = {}
    for path in sorted(avro_dir.glob("*.avsc")) if avro_dir.is_dir() else []:
        text = path.read_text()
        parsed = json.loads(text)  # a broken schema fails the plan, not the Job at 3 a.m.
        topics = topics_by_schema.get(path.stem)
        if topics:
            out.update({f"{t}-value": text for t in topics})
        else:
            ns = parsed.get("namespace")
            out[f"{ns}.{parsed['name']}" if ns else parsed["name"]] = text
    return out


def _level(client: Any, subject: str | None) -> str | None:
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    try:
        return str(client.get_compatibility(subject) if subject else client.get_compatibility())
    except SchemaRegistryError as e:
        if e.http_status_code == 404:
            return None  # the subject has no level of its own
        raise


def apply(client: Any, subject_schemas: Mapping[str, str], level: str = COMPATIBILITY) -> list[str]:
    """Make the registry hold every schema under its subject at `level`; returns what changed
    ([] on a rerun). `client` is confluent-kafka's SchemaRegistryClient."""
    from confluent_kafka.schema_registry import Schema
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    changed = []
    try:
        if _level(client, None) != level:
            client.set_compatibility(level=level)
            changed.append(f"config {level}")
        for subject, text in subject_schemas.items():
            if _level(client, subject) != level:
                client.set_compatibility(subject, level)
                changed.append(f"config {subject} {level}")
            schema = Schema(text, "AVRO")
            try:
                client.lookup_schema(subject, schema)
                continue  # already registered: nothing to do
            except SchemaRegistryError as e:
                if e.http_status_code != 404:
                    raise
            schema_id = client.register_schema(subject, schema)
            changed.append(f"register {subject} id {schema_id}")
    except SchemaRegistryError as e:
        raise RegistrationError(f"schema registry: {e}") from e
    return changed


def main() -> None:
    """The production Job: the registry's address and login from the LIKES_* variables the
    workloads get (the password from a Secret)."""
    import os

    from confluent_kafka.schema_registry import SchemaRegistryClient

    from services.contracts import registry
    from services.contracts.settings import Settings

    env, name = os.environ, Settings.env_name
    creds = registry.Credentials(
        env[name("schema_registry_user")], env[name("schema_registry_password")]
    )
    url = env[name("schema_registry_url")]
    client = SchemaRegistryClient(registry.client_config(url, creds, timeout=10))
    changed = apply(client, subjects())
    print("schema registry: " + ("; ".join(changed) if changed else "already as wanted"))


if __name__ == "__main__":
    try:
        main()
    except RegistrationError as e:
        print(str(e), file=sys.stderr)
        sys.exit(1)
