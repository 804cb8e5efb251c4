"""The local stack's components, in start order (dependencies first)."""

from __future__ import annotations

from local.components.base import Component, ProbeFailed, Server
from local.layout import Layout

__all__ = ["Component", "ProbeFailed", "Server", "build"]


def build(layout: Layout) -> list[Component]:
    """Every component of the local stack; Prometheus last so it can scrape the others."""
    # imported here: each module pulls in its own client library
    from local.components import (
        cassandra,
        etcd,
        hotkeys,
        kafka,
        observability,
        redis,
        schema_registry,
        services,
    )

    comps: list[Component] = [
        etcd.Etcd(layout),
        redis.IdemStore(layout),
        redis.CountCache(layout),
        kafka.Kafka(layout),
        cassandra.Cassandra(layout),
        schema_registry.SchemaRegistry(layout),
        *services.build(layout),
        *hotkeys.build(layout),
        observability.Alertmanager(layout),
    ]

    def targets() -> dict[str, list[str]]:
        return {c.name: c.metrics_targets() for c in comps}

    comps.append(observability.Prometheus(layout, targets))
    return comps
