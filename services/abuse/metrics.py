"""The abuse scorer's Prometheus metrics (served on /metrics by services.common.worker_http)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from services.contracts import metrics as names

EVENTS = Counter(names.ABUSE_EVENTS_CONSUMED, "Events read from likes.committed")
UNREADABLE = Counter("likes_abuse_unreadable_total", "Events that could not be decoded (skipped)")
SCORED = Counter(names.ABUSE_SCORED, "Likes the model scored")
SCORES = Histogram(
    names.ABUSE_SCORES,
    "The model's probability that a like is a bot's",
    buckets=(0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99),
)
VOIDS = Counter(names.ABUSE_VOIDS, "Voids attempted, by what each found", ["result"])
DEFERRED = Gauge(names.ABUSE_DEFERRED, "1 while a batch waits for the model server or a store")
DEPENDENCY_FAILURES = Counter(
    names.ABUSE_DEPENDENCY_FAILURES, "Scoring attempts a dependency failed", ["dependency"]
)
# bound at start, so "no void, no failure" reads 0 on a dashboard, not "No data"
for _result in ("voided", "replayed"):
    VOIDS.labels(_result)
DEGRADED = Counter(names.ABUSE_DEGRADED, "Accounts degraded for a storm of voided likes")
LOOP_TIMESTAMP = Gauge(
    names.ABUSE_LOOP_TIMESTAMP, "Unix time the scorer's loop last went round (a heartbeat)"
)
