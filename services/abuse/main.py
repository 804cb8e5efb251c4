"""Wiring: the scorer on clients from its settings; `build()` is shared by `python -m
services.abuse`, the tests and the benchmark."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer

from services.abuse.features import Features
from services.abuse.model_server import ModelClient
from services.abuse.scorer import Scorer, StormWatch
from services.abuse.settings import ScorerSettings
from services.abuse.shared_features import SharedFeatures
from services.abuse.voids import Voider
from services.contracts import clients
from services.write.core import Publisher


def consumer_config(s: ScorerSettings, **overrides: Any) -> dict[str, Any]:
    conf: dict[str, Any] = {
        **clients.kafka_config(s),
        "group.id": s.abuse_group_id,
        "enable.auto.commit": False,  # offsets move only after a batch's voids are written
        "auto.offset.reset": "earliest",  # a new group scores what the topic still holds
        "partition.assignment.strategy": "range",  # eager: a revoke drops a held batch whole
        "session.timeout.ms": 10000,
        "heartbeat.interval.ms": 3000,
        "max.poll.interval.ms": 300000,
    }
    conf.update(overrides)
    return conf


@dataclass
class Built:
    scorer: Scorer
    close: Callable[[], None]


def build(s: ScorerSettings, **consumer_overrides: Any) -> Built:
    """A Scorer on fresh clients; the caller runs it and calls `close` after."""
    cluster, session = clients.cassandra(
        s, request_timeout=10.0, first_connect_s=clients.FIRST_CONNECT_S
    )
    registry = clients.schema_registry(s)
    publisher = Publisher(clients.producer(s))
    idem = clients.idem_store(s, timeout=2.0)  # the storm watch, beside the degraded list
    shared = clients.feature_store(s, timeout=2.0) if s.abuse_feature_store == "shared" else None
    model = ModelClient(s.abuse_model_target, s.abuse_model_timeout_s)
    overrides = {k.replace("_", "."): v for k, v in consumer_overrides.items()}
    voider = Voider(
        session=session, publisher=publisher, region=s.region,
        serialize=clients.like_serializer(registry), idem=idem,
    )  # fmt: skip
    scorer = Scorer(
        s,
        consumer=Consumer(consumer_config(s, **overrides)),
        deserialize=clients.like_deserializer(registry),
        # the shared state is namespaced like the topics (a benchmark's copies keep their own)
        features=(
            SharedFeatures(shared, prefix=s.abuse_topic_prefix)
            if shared is not None
            else Features()
        ),
        model=model,
        voider=voider,
        storms=StormWatch(idem),
    )

    def close() -> None:
        model.close()
        publisher.close()
        idem.close()
        if shared is not None:
            shared.close()
        cluster.shutdown()

    return Built(scorer, close)
