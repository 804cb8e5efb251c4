"""Metric names another layer reads (the alert rules in infra/alert_rules.py, the dashboards in
infra/dashboards.py), defined once: the code that exports a metric and the rule or panel that
reads it import the name from here."""

from __future__ import annotations

# every service's RED metrics (services/common/http.py), labelled service, route, status
HTTP_REQUESTS = "likes_http_requests_total"
HTTP_DURATION = "likes_http_request_duration_seconds"  # a histogram: _bucket, _count, _sum

# the aggregator's loop (services/aggregator/metrics.py)
AGGREGATOR_EVENTS_CONSUMED = "likes_aggregator_events_consumed_total"  # label topic
AGGREGATOR_EVENTS_APPLIED = "likes_aggregator_events_applied_total"
AGGREGATOR_DEDUP_HITS = "likes_aggregator_dedup_hits_total"
AGGREGATOR_WINDOWS_FLUSHED = "likes_aggregator_windows_flushed_total"
AGGREGATOR_FLUSH_SECONDS = "likes_aggregator_flush_seconds"  # a histogram
AGGREGATOR_COLLAPSE_FACTOR = "likes_aggregator_collapse_factor"
AGGREGATOR_DEAD_LETTERS = "likes_aggregator_dead_letter_total"
AGGREGATOR_HOT_POOL_COPIES = "likes_aggregator_hot_pool_copies_total"  # label result

# the outbox relay (services/relay/core.py)
OUTBOX_BACKLOG = "likes_outbox_backlog"
OUTBOX_PUBLISHED = "likes_outbox_published_total"
OUTBOX_PUBLISH_FAILURES = "likes_outbox_publish_failures_total"
OUTBOX_RELAY_MEMBERS = "likes_outbox_relay_members"
# rows cleaned up unpublished: their writer noted the event as acked by Kafka (keys.published_key)
OUTBOX_ALREADY_PUBLISHED = "likes_outbox_already_published_total"

# the read service's own (services/read/metrics.py, services/read/hotkeys.py)
READ_HOT_POOL = "likes_read_hot_pool_total"  # label result
READ_HOT_POOL_FILLS = "likes_read_hot_pool_fills_total"  # label result
READ_DEPENDENCY_ERRORS = "likes_read_dependency_errors_total"  # label dependency

# hot keys: the sampler's flags and the operator's (or the local loop's) decisions
SAMPLER_SAMPLES = "likes_sampler_samples_total"
SAMPLER_PUBLISHED_POSTS = "likes_sampler_published_posts"
HOTKEYS_HOT = "likes_hotkeys_hot"
HOTKEYS_SPLIT = "likes_hotkeys_split"
HOTKEYS_RECONCILE_ERRORS = "likes_hotkeys_reconcile_errors_total"

# the aggregator's CDN purges (services/aggregator/purge.py)
# the abuse scorer (services/abuse): likes scored, voids by what each found, deferrals
ABUSE_EVENTS_CONSUMED = "likes_abuse_events_consumed_total"
ABUSE_SCORED = "likes_abuse_scored_total"
ABUSE_VOIDS = "likes_abuse_voids_total"  # label result: voided, replayed, not-liked, ...
ABUSE_SCORES = "likes_abuse_score"  # a histogram of the model's probabilities
ABUSE_DEGRADED = "likes_abuse_degraded_total"  # accounts degraded (a storm): pages the abuse team
ABUSE_DEFERRED = "likes_abuse_deferred"  # 1 while a batch waits for the model or a store
ABUSE_DEPENDENCY_FAILURES = "likes_abuse_dependency_failures_total"  # label dependency
ABUSE_LOOP_TIMESTAMP = "likes_abuse_loop_timestamp_seconds"
# the model server (the scorer's sidecar, scraped as workload="abuse-model")
ABUSE_MODEL_CALLS = "likes_abuse_model_calls_total"  # Score calls by answer: label code
ABUSE_MODEL_ROWS = "likes_abuse_model_rows_scored_total"
ABUSE_MODEL_SECONDS = "likes_abuse_model_score_seconds"  # a histogram of each call's time
ABUSE_MODEL_SERVING = "likes_abuse_model_serving"  # 1 for the version serving: label version
# 1 while the version `current` names does not load (label version): the previous one serves on
ABUSE_MODEL_LOAD_FAILING = "likes_abuse_model_load_failing"
# when the version serving was trained (its meta.json's trained_at; 0 when it does not say)
ABUSE_MODEL_TRAINED = "likes_abuse_model_trained_timestamp_seconds"
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
CONSUMER_LAG_READS = "likes_consumer_lag_reads_total"  # label result: ok | partial | error
# per group: the partitions whose lag the last read could not learn (their leader, or the group's
# coordinator, did not answer); their lag series are left out meanwhile
CONSUMER_LAG_UNREAD = "likes_consumer_lag_unread_partitions"
CONSUMER_LAG_GROUP_LABEL = "group"  # the lag series' labels: group, topic, partition

# heartbeats: the unix time a worker's loop last went round (set every turn). A loop that hangs
# while its ops thread still answers scrapes keeps exporting an old time: `time() - this` grows.
AGGREGATOR_LOOP_TIMESTAMP = "likes_aggregator_loop_timestamp_seconds"
OUTBOX_RELAY_LOOP_TIMESTAMP = "likes_outbox_relay_loop_timestamp_seconds"
# the consumers' dead-letter sends the topic refused: likes_aggregator_dead_letter_failures_total
# (the poison message is logged and skipped) and likes_outbox_dead_letter_failures_total (the row
# stays and is retried)
DEAD_LETTER_FAILURES = r"likes_.+_dead_letter_failures_total"
# every consumer's dead-letter sends (likes_aggregator_dead_letter_total, likes_outbox_dead_letter_
# total): a __name__ regex, what the DeadLetterDailyGrowth alert sums
DEAD_LETTERS = r"likes_.+_dead_letter_total"
AGGREGATOR_FLUSH_FAILURES = "likes_aggregator_flush_failures_total"
AGGREGATOR_COMMIT_FAILURES = "likes_aggregator_commit_failures_total"
OUTBOX_OLDEST_AGE = "likes_outbox_oldest_age_seconds"
READ_BREAKER_OPEN = "likes_read_breaker_open"

# the read service's answers, one per post, by the tier that answered (services/read/core.py
# `Tier`): the last good value and null are degraded answers, bad events of read availability
READ_TIER = "likes_read_tier_total"
READ_TIER_LABEL = "tier"
READ_DEGRADED_TIERS = ("last_good", "none")
READ_DEGRADED_TIER_RE = "|".join(READ_DEGRADED_TIERS)  # for a =~ matcher

# Envoy's own series (its stats listener, infra/envoy_config.STATS_PATH), per upstream cluster
# (label envoy_cluster_name): completed requests, and by response class (envoy_response_code_class
# 1-5). A request Envoy could not deliver (no upstream, connect refused, timeout) is completed
# and counted in class 5 here though no service ever saw it.
ENVOY_CLUSTER_RQ_COMPLETED = "envoy_cluster_upstream_rq_completed"
ENVOY_CLUSTER_RQ_XX = "envoy_cluster_upstream_rq_xx"
ENVOY_CLUSTER_LABEL = "envoy_cluster_name"
# the gateway's cluster for the read service (infra/envoy_config.READ_CLUSTER): its label value
GATEWAY_READ_CLUSTER = "read_svc"
GATEWAY_WRITE_CLUSTER = "write_svc"  # the write SLI selects the gateway's stats by this name

# MirrorMaker 2's replication latency per mirrored partition, in ms (the seed's mm2_lag_seconds):
# what infra/jmx/mirrormaker2.yaml names the MirrorSourceConnector's replication-latency-ms-max
MM2_REPLICATION_LATENCY_MAX = "kafka_connect_mirror_source_connector_replication_latency_ms_max"

# the canary (services/canary): its turns by result (match | drift | error), the reads it made
# after its own likes, and the flickers among them. The seed's canary_drift_ratio and
# count_flicker_per_user are recorded from these (infra/alert_rules.py).
CANARY_TURNS = "likes_canary_turns_total"
CANARY_READS_AFTER_LIKE = "likes_canary_reads_after_like_total"
CANARY_FLICKERS = "likes_canary_flickers_total"
CANARY_DRIFT_RATIO = "likes_canary_drift_ratio"
COUNT_FLICKER_PER_USER = "likes_count_flicker_per_user"

# the OpenTelemetry Collector's own series (infra/otel_config.telemetry): traces its tail
# sampling kept (label sampled="true"), and spans an exporter gave up on. At the release the
# program deploys (0.161) its counters carry no _total suffix. The seed's traces_kept_per_second
# and otlp_export_failures are recorded from these (infra/alert_rules.py).
OTELCOL_TRACES_SAMPLED = "otelcol_processor_tail_sampling_global_count_traces_sampled"
OTELCOL_SEND_FAILED_SPANS = "otelcol_exporter_send_failed_spans"
TRACES_KEPT_PER_SECOND = "likes_traces_kept_per_second"
OTLP_EXPORT_FAILURES = "likes_otlp_export_failures"

# every workload that honors a kill switch (services/contracts/flags.py), label switch: 1 on
KILL_SWITCH = "likes_kill_switch"
# the write service's and the aggregator's schema caches dropped by schema-cache-flush
SCHEMA_CACHE_FLUSHES = "likes_schema_cache_flushes_total"
