"""The event spine's topics and their settings; created idempotently by the local stack and
declared as KafkaTopic resources by infra/kafka.py for production (256 partitions there)."""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka.admin import AdminClient, NewTopic

from services.contracts import events

THIRTY_DAYS_MS = 30 * 24 * 3600 * 1000


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str]


def local_specs() -> list[TopicSpec]:
    """Few partitions on one machine; production's counts live in the stack config."""
    return [
        *(TopicSpec(t, 6, {}) for t in events.EVENT_TOPICS),
        TopicSpec(events.DEAD_LETTER, 2, {"retention.ms": str(THIRTY_DAYS_MS)}),
    ]


def ensure(bootstrap: str, brokers: int, specs: list[TopicSpec], timeout: float = 30) -> list[str]:
    """Create the missing topics (RF min(3, brokers), min ISR 2 with 3 brokers); return them."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
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
