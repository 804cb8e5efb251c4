"""The consumer-lag exporter's series (names: services/contracts/metrics.py)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from services.contracts import metrics as names

_LABELS = [names.CONSUMER_LAG_GROUP_LABEL, "topic", "partition"]
LAG_SECONDS = Gauge(
    names.CONSUMER_LAG_SECONDS,
    "Age of the oldest message the group has not consumed (now minus the timestamp of the "
    "message at its committed offset); 0 when caught up",
    _LABELS,
)
LAG_MESSAGES = Gauge(
    names.CONSUMER_LAG_MESSAGES, "Messages between the committed offset and the log end", _LABELS
)
UNREAD = Gauge(
    names.CONSUMER_LAG_UNREAD,
    "Partitions whose lag the last read could not learn (their leader or the group's "
    "coordinator did not answer); their lag series are left out",
    [names.CONSUMER_LAG_GROUP_LABEL],
)
READS = Counter(names.CONSUMER_LAG_READS, "Reads of the offsets from Kafka", ["result"])
for _result in ("ok", "partial", "error"):
    READS.labels(_result)
LAG_READ_SPAN = "lag read"  # one span per read of the groups' offsets (every few seconds)
