"""The local stack's components, in start order (dependencies first)."""

from __future__ import annotations

from local.components.base import Component, ProbeFailed, Server
from local.layout import Layout

__all__ = ["Component", "ProbeFailed", "Server", "build"]


def build(layout: Layout, strict: bool = True) -> list[Component]:
    """Every component of the local stack; Prometheus last so it can scrape the others.
    `strict`: fail when the rendered workloads disagree with the code (see services.build)."""
    # imported here: each module pulls in its own client library
    from local import rendered
    from local.components import (
        cassandra,
        etcd,
        gateway,
        hotkeys,
        issuer,
        kafka,
        observability,
        redis,
        schema_registry,
        services,
        toxiproxy,
    )
    from services.contracts import workloads

    def _gateway(layout: Layout, strict: bool) -> list[Component]:
        front = (workloads.WRITE.name, workloads.READ.name, workloads.HOTKEY_SAMPLER.name)
        try:
            return gateway.build(layout, layout.stack, upstreams=front)
        except (rendered.RenderError, gateway.MissingBinary):
            if strict:
                raise
            return []

    comps: list[Component] = [
        etcd.Etcd(layout),
        observability.OtelCollector(layout),  # before every workload that exports spans
        # the --faults profile: the proxies come first, the nodes behind them announce them
        *([toxiproxy.Toxiproxy(layout)] if layout.faults else []),
        redis.IdemStore(layout),
        redis.CountCache(layout),
        redis.FeatureStore(layout),
        redis.Exporter(layout),
        kafka.Kafka(layout),
        cassandra.Cassandra(layout),
        schema_registry.SchemaRegistry(layout),
        *hotkeys.build(layout),
        issuer.IdentityProvider(layout),
        *services.build(layout, strict),
        *_gateway(layout, strict),
        observability.Alertmanager(layout),
    ]

    def targets() -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for c in comps:
            for workload, addresses in c.scrape_targets().items():
                out.setdefault(workload, []).extend(addresses)
        return out

    comps.append(observability.Prometheus(layout, targets))
    return comps
