"""The aggregator's Prometheus metrics (served on /metrics by services.common.worker_http)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from services.contracts import metrics as names

EVENTS = Counter(names.AGGREGATOR_EVENTS_CONSUMED, "Messages consumed", ["topic"])
APPLIED = Counter(names.AGGREGATOR_EVENTS_APPLIED, "Events folded into a counter-store cell")
REPLAYED = Counter(
    "likes_aggregator_events_replay_skipped_total",
    "Events skipped because their cell already holds their offset (a replay)",
)
DEDUP_HITS = Counter(
    names.AGGREGATOR_DEDUP_HITS, "Duplicate publications of an intent, not counted"
)
WINDOWS = Counter(names.AGGREGATOR_WINDOWS_FLUSHED, "Windows flushed and committed")
FLUSH_FAILURES = Counter(
    names.AGGREGATOR_FLUSH_FAILURES, "Window flush attempts that failed (then retried)"
)
FLUSH_SECONDS = Histogram(
    names.AGGREGATOR_FLUSH_SECONDS,
    "Time to flush one window (cells, aggregates, purge, commit)",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
STORE_WRITES = Counter(
    "likes_aggregator_store_writes_total", "Counter-store cell writes (one per cell per window)"
)
STORE_BATCHES = Counter(
    "likes_aggregator_store_batches_total", "Posts whose cells a window wrote (one row set each)"
)
COLLAPSE = Gauge(
    names.AGGREGATOR_COLLAPSE_FACTOR, "Events per counter-store cell write, last window"
)
CACHE_WRITES = Counter(
    "likes_aggregator_cache_writes_total",
    "Aggregate writes to the count-cache by result (stale = a newer gen was stored)",
    ["result"],
)
CACHE_FAULTS = Counter(
    "likes_aggregator_cache_faults_total",
    "Count-cache writes that failed (OOM, a node down); the offsets still move on, and the "
    "posts are rewritten from the counter-store by later windows",
    ["what"],
)
CACHE_UNSYNCED = Gauge(
    "likes_aggregator_cache_unsynced",
    "Aggregates / Bloom adds the count-cache refused, held for a later window's retry",
    ["what"],
)
CACHE_DROPPED = Counter(
    "likes_aggregator_cache_unsynced_dropped_total",
    "Retries given up because the held set was full (aggregates: fixed by the post's next event "
    "or the reconciler; Bloom adds: a has_liked 'no' possible until the filter's TTL)",
    ["what"],
)
CACHE_REDRIVES = Counter(
    "likes_aggregator_cache_redrives_total",
    "Count-cache failovers seen (its epoch moved): the last REDRIVE_S of aggregates and Bloom "
    "adds were written again, since asynchronous replication may have lost them",
)
HOT_POOL_COPIES = Counter(
    names.AGGREGATOR_HOT_POOL_COPIES,
    "Aggregates copied into the hot pools by always-replicate, by result "
    "(written, stale: a newer gen was there, failed, skipped: pool cooling down after a failure; "
    "redriven: a copy a pool had missed, written once it answered again)",
    ["result"],
)
HOT_POOL_COPY_SECONDS = Histogram(
    "likes_aggregator_hot_pool_copy_seconds",
    "Time a window spends copying its aggregates into the hot pools (always-replicate)",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
)
PURGED = Counter(names.CDN_PURGED, "Surrogate keys purged")
PURGE_FAILURES = Counter(
    names.CDN_PURGE_FAILURES,
    "CDN purge calls given up on after their retries (the keys expire by TTL instead)",
)
PURGE_RETRIES = Counter(names.CDN_PURGE_RETRIES, "CDN purge calls retried after a failure")
PURGE_DROPPED = Counter(
    names.CDN_PURGE_DROPPED, "Surrogate keys not purged because the pending set was full"
)
DLQ = Counter(names.AGGREGATOR_DEAD_LETTERS, "Messages sent to the dead-letter topic")
DLQ_FAILURES = Counter(
    "likes_aggregator_dead_letter_failures_total",
    "Poison messages the dead-letter topic refused: logged in full and skipped",
)
COMMIT_FAILURES = Counter(names.AGGREGATOR_COMMIT_FAILURES, "Offset commits that failed")
LOOP_TIMESTAMP = Gauge(
    names.AGGREGATOR_LOOP_TIMESTAMP, "Unix time the consumer loop last went round (a heartbeat)"
)
LAG = Gauge(
    "likes_aggregator_consumer_lag_seconds",
    "Now minus the timestamp of the last consumed message (0 when caught up)",
    ["topic", "partition"],
)
ASSIGNED = Gauge("likes_aggregator_assigned_partitions", "Partitions assigned to this consumer")
DEDUP_SIZE = Gauge("likes_aggregator_dedup_entries", "Intents held in the dedup sets")
DEDUP_HORIZON = Gauge(
    "likes_aggregator_dedup_horizon_seconds",
    "Message time between the oldest and newest intent a partition's dedup set holds: a "
    "duplicate publication older than this counts twice (below HOLD_S: raise the capacity)",
    ["topic", "partition"],
)
