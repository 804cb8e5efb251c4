"""The consumer-lag exporter's export of one read: a partition it could not read loses its
series (no old reading that looks current) and is counted per group, which ConsumerLagUnknown
watches; a partition read again gets its series back."""

from __future__ import annotations

from prometheus_client import REGISTRY

from services.consumer_lag.__main__ import export
from services.consumer_lag.core import LagRead, PartitionLag, Unread
from services.contracts import metrics as names

GROUPS = ["g-export-a", "g-export-b"]
TOPIC = "likes.test-export"


def _lag(group: str, partition: int, seconds: float) -> PartitionLag:
    return PartitionLag(group, TOPIC, partition, 3, 0, 5, seconds)


def _seconds(group: str, partition: int) -> float | None:
    labels = {names.CONSUMER_LAG_GROUP_LABEL: group, "topic": TOPIC, "partition": str(partition)}
    return REGISTRY.get_sample_value(names.CONSUMER_LAG_SECONDS, labels)


def _unread(group: str) -> float | None:
    return REGISTRY.get_sample_value(
        names.CONSUMER_LAG_UNREAD, {names.CONSUMER_LAG_GROUP_LABEL: group}
    )


def test_an_unread_partition_loses_its_series_and_is_counted_for_its_group() -> None:
    a, b = GROUPS
    export(LagRead([_lag(a, 0, 1.0), _lag(a, 1, 2.0), _lag(b, 0, 3.0)], []), GROUPS)
    assert (_seconds(a, 0), _seconds(a, 1), _seconds(b, 0)) == (1.0, 2.0, 3.0)
    assert (_unread(a), _unread(b)) == (0, 0)

    export(LagRead([_lag(a, 0, 4.0), _lag(b, 0, 5.0)], [Unread(a, TOPIC, 1, "timeout")]), GROUPS)
    assert (_seconds(a, 0), _seconds(a, 1), _seconds(b, 0)) == (4.0, None, 5.0)
    assert (_unread(a), _unread(b)) == (1, 0)

    export(LagRead([_lag(a, 0, 6.0), _lag(a, 1, 7.0), _lag(b, 0, 8.0)], []), GROUPS)
    assert (_seconds(a, 1), _unread(a)) == (7.0, 0)


def test_a_partition_never_read_before_is_counted_without_a_series_to_remove() -> None:
    export(LagRead([], [Unread("g-export-c", TOPIC, 9, "coordinator")]), ["g-export-c"])
    assert _seconds("g-export-c", 9) is None and _unread("g-export-c") == 1
