"""The consumer-lag exporter's settings: the shared LIKES_* settings plus LIKES_LAG_*."""

from __future__ import annotations

from pydantic import Field

from services.contracts import events
from services.contracts import kafka as kafka_contract
from services.contracts.settings import Settings


class LagSettings(Settings):
    # the consumer groups watched, comma-separated, and the topics each is expected to read
    lag_groups: str = kafka_contract.AGGREGATOR_GROUP
    lag_topics: str = ",".join(events.EVENT_TOPICS)
    lag_interval_s: float = Field(default=5.0, gt=0)  # between two reads of the offsets
    lag_timeout_s: float = Field(default=5.0, gt=0)  # each Kafka call's bound

    @property
    def groups(self) -> list[str]:
        return [g.strip() for g in self.lag_groups.split(",") if g.strip()]

    @property
    def topics(self) -> list[str]:
        return [t.strip() for t in self.lag_topics.split(",") if t.strip()]
