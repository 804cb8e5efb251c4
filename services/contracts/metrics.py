"""Metric names another layer reads (the alert rules in infra/alert_rules.py), defined once: the
code that exports a metric and the rule that alerts on it import the name from here."""

from __future__ import annotations

# the aggregator's CDN purges (services/aggregator/purge.py)
CDN_PURGED = "likes_aggregator_cdn_purged_total"
CDN_PURGE_FAILURES = "likes_aggregator_cdn_purge_failures_total"  # batches given up on
CDN_PURGE_RETRIES = "likes_aggregator_cdn_purge_retries_total"
CDN_PURGE_DROPPED = "likes_aggregator_cdn_purge_dropped_total"
