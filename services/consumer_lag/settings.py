"""The consumer-lag exporter's settings: the shared LIKES_* settings plus LIKES_LAG_*."""

from __future__ import annotations

from pydantic import Field

from services.contracts import events
from services.contracts import kafka as kafka_contract
from services.contracts.settings import Settings


class LagSettings(Settings):
    # the consumer groups watched, comma-separated, and the topics each is expected to read;
    # `lag_group_topics` narrows a group to the topics it subscribes to (group=topic+topic,...):
    # the abuse scorer reads likes.committed only, and would otherwise show the whole of the
    # voided topics as lag
    lag_groups: str = f"{kafka_contract.AGGREGATOR_GROUP},{kafka_contract.ABUSE_GROUP}"
    lag_topics: str = ",".join(events.EVENT_TOPICS)
    lag_group_topics: str = f"{kafka_contract.ABUSE_GROUP}={events.COMMITTED}"
    lag_interval_s: float = Field(default=5.0, gt=0)  # between two reads of the offsets
    lag_timeout_s: float = Field(default=5.0, gt=0)  # each Kafka call's bound

    @property
    def groups(self) -> list[str]:
        return [g.strip() for g in self.lag_groups.split(",") if g.strip()]

    @property
    def topics(self) -> list[str]:
        return [t.strip() for t in self.lag_topics.split(",") if t.strip()]

    @property
    def topics_of(self) -> dict[str, list[str]]:
        return parse_group_topics(self.lag_group_topics)


def parse_group_topics(raw: str) -> dict[str, list[str]]:
    """`group=topic+topic,group=topic` -> {group: [topic, ...]}; ValueError names a bad item."""
    out: dict[str, list[str]] = {}
    for item in (i.strip() for i in raw.split(",")):
        if not item:
            continue
        group, sep, topics = item.partition("=")
        names = [t.strip() for t in topics.split("+") if t.strip()]
        if not sep or not group.strip() or not names:
            raise ValueError(f"lag_group_topics: {item!r} is not group=topic[+topic...]")
        out[group.strip()] = names
    return out
