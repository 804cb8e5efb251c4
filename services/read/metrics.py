"""The read service's own Prometheus series (RED per route comes from services.common.http)."""

from __future__ import annotations

from typing import Generic, TypeVar

from prometheus_client import Counter, Gauge
from prometheus_client.metrics import MetricWrapperBase

from services.contracts import metrics as names

M = TypeVar("M", bound=MetricWrapperBase)


class Children(Generic[M]):
    """A one-label metric's children, bound on first use and kept: `metric.labels(v)` validates,
    hashes and takes a lock on every call, and the read path calls it several times a request."""

    def __init__(self, metric: M) -> None:
        self.metric: M = metric
        self._children: dict[str, M] = {}

    def __getitem__(self, value: str) -> M:
        child = self._children.get(value)
        if child is None:
            child = self._children[value] = self.metric.labels(value)
        return child


TIER = Counter(
    names.READ_TIER,
    "Post counts answered, by the tier that answered "
    "(aggregate, subcounters, counter_store, last_good, none)",
    [names.READ_TIER_LABEL],
)
HAS_LIKED = Counter(
    "likes_read_has_liked_total",
    "has_liked lookups by outcome: no (Bloom filter, no edge-store read), maybe (sent to the "
    "edge-store), then confirmed / false_positive / unavailable for each maybe",
    ["outcome"],
)
BLOOM_REBUILDS = Counter(
    "likes_read_bloom_rebuilds_total",
    "has_liked filters rebuilt from the edge-store after a miss, by outcome: built, raced (a "
    "like landed meanwhile), exists (someone else had it), skipped (too many in flight), failed",
    ["outcome"],
)
DEPENDENCY_ERRORS = Counter(
    names.READ_DEPENDENCY_ERRORS,
    "Failed or refused calls to a dependency (count-cache, counter-store, edge-store)",
    ["dependency"],
)
BREAKER_OPEN = Gauge(
    names.READ_BREAKER_OPEN, "1 while the dependency's circuit breaker is open", ["dependency"]
)
DEGRADED = Counter(
    "likes_read_degraded_total",
    "Answers degraded by an unexpected exception (served from last good or null, still 200)",
    ["route"],
)
FAST_PATH = Counter(
    "likes_read_fast_path_total",
    "Requests to /v1 answered by the plain ASGI front (served) or left to the FastAPI routes "
    "(passed: bad input, a refused token, another method or path, a duplicated header)",
    ["outcome"],
)
