"""Creating the event spine's topics: the program declares them as KafkaTopic resources
(infra/kafka.py, names from services/contracts/events.py); the local stack creates what the program
renders, scaled down (local/transforms.py topic_specs)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str]


def ensure(
    kafka_conf: dict[str, Any], brokers: int, specs: list[TopicSpec], timeout: float = 30
) -> list[str]:
    """Create the missing topics (RF min(3, brokers), min ISR 2 with 3 brokers); return them.
    `kafka_conf`: a client's connection settings, logged in as a user allowed to create topics
    (locally the admin user: the services' may not)."""
    admin = AdminClient(kafka_conf)
    existing = set(admin.list_topics(timeout=timeout).topics)
    rf = min(3, brokers)
    new = [
        NewTopic(
            s.name,
            s.partitions,
            rf,
            config={"min.insync.replicas": str(min(2, rf)), **s.config},
        )
        for s in specs
        if s.name not in existing
    ]
    if not new:
        return []
    for fut in admin.create_topics(new, operation_timeout=timeout).values():
        try:
            fut.result(timeout)
        except Exception as e:  # created concurrently by another `up`: fine
            if "TOPIC_ALREADY_EXISTS" not in str(e):
                raise
    return [t.topic for t in new]
