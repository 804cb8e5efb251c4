"""The read service's own Prometheus series (RED per route comes from services.common.http)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

TIER = Counter(
    "likes_read_tier_total",
    "Post counts answered, by the tier that answered "
    "(aggregate, subcounters, counter_store, last_good, none)",
    ["tier"],
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
    "likes_read_dependency_errors_total",
    "Failed or refused calls to a dependency (count-cache, counter-store, edge-store)",
    ["dependency"],
)
BREAKER_OPEN = Gauge(
    "likes_read_breaker_open", "1 while the dependency's circuit breaker is open", ["dependency"]
)
DEGRADED = Counter(
    "likes_read_degraded_total",
    "Answers degraded by an unexpected exception (served from last good or null, still 200)",
    ["route"],
)
