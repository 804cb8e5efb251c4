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
READS = Counter(names.CONSUMER_LAG_READS, "Reads of the offsets from Kafka", ["result"])
for _result in ("ok", "error"):
    READS.labels(_result)
LAG_READ_SPAN = "lag read"  # one span per read of the groups' offsets (every few seconds)
