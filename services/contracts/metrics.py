"""Metric names another layer reads (the alert rules in infra/alert_rules.py), defined once: the
code that exports a metric and the rule that alerts on it import the name from here."""

from __future__ import annotations

# the aggregator's CDN purges (services/aggregator/purge.py)
CDN_PURGED = "likes_aggregator_cdn_purged_total"
CDN_PURGE_FAILURES = "likes_aggregator_cdn_purge_failures_total"  # batches given up on
CDN_PURGE_RETRIES = "likes_aggregator_cdn_purge_retries_total"
CDN_PURGE_DROPPED = "likes_aggregator_cdn_purge_dropped_total"

# the outbox relay's shard leases (services/relay/leases.py): every replica reports how many of
# the outbox shards the lease table shows without an owner after its renewal (nobody drains
# them: their rows wait for no one), and how many it holds itself
OUTBOX_RELAY_UNOWNED_SHARDS = "likes_outbox_relay_unowned_shards"
OUTBOX_RELAY_OWNED_SHARDS = "likes_outbox_relay_owned_shards"

# the consumer-lag exporter (services/consumer_lag): per group, topic and partition, read from
# Kafka; the seed's consumer_lag_seconds
CONSUMER_LAG_SECONDS = "likes_consumer_lag_seconds"
CONSUMER_LAG_MESSAGES = "likes_consumer_lag_messages"
CONSUMER_LAG_READS = "likes_consumer_lag_reads_total"  # label result: ok | error
