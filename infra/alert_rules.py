"""Prometheus rules for the seed's SLIs: multi-window multi-burn-rate SLO alerts (SRE Workbook,
"Alerting on SLOs", table 5-8) plus the plain alerts the seed names.

`python -m infra.alert_rules infra/rules` regenerates the committed rules file; a test keeps the two
equal, and the promtool unit tests beside it exercise the generated alerts.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from infra import otel_config
from services.contracts import convergence, events, workloads
from services.contracts import metrics as metric_names

__all__ = [
    "ABUSE_SCORER",
    "ABUSE_SCORING_STALLED",
    "ABUSE_STORM",
    "ABUSE_STORM_ACCOUNTS",
    "ABUSE_TEAM",
    "AGGREGATOR",
    "API_ROUTES",
    "BAD_BIT",
    "BURN_RATE_ALERTS",
    "CANARY",
    "CANARY_DRIFT",
    "CANARY_FAILING",
    "CDN_PURGE_FAILING",
    "COUNT_CACHE_PRIMARY_OPS",
    "COUNT_CACHE_REPLICATION",
    "COUNT_CACHE_SELECTOR",
    "COUNT_CACHE_SKEW",
    "COUNT_FLICKER",
    "DEAD_LETTER_DAILY_GROWTH",
    "DEAD_LETTER_DAILY_LIMIT",
    "HOTKEY_OPERATOR",
    "HOTKEY_SAMPLER",
    "INHIBITIONS",
    "OUTBOX_RELAY",
    "OUTBOX_SHARDS_UNOWNED",
    "READ",
    "REDIS_SHARD_QPS_SKEW",
    "REPLICATION_LAG_SECONDS",
    "RULES_FILENAME",
    "SERVICE_LABEL",
    "SEVERITIES",
    "SEVERITY_NONE",
    "SEVERITY_PAGE",
    "SEVERITY_TICKET",
    "SLO_PERIOD",
    "TEAM_LABEL",
    "WATCHDOG",
    "WINDOWS",
    "WORKLOADS",
    "WORKLOAD_LABEL",
    "WRITE",
    "WRITE_AVAILABILITY",
    "WRITE_AVAILABILITY_BURN",
    "BurnRateAlert",
    "Inhibition",
    "Slo",
    "abuse_alerts",
    "alert_name",
    "burn_alert_name",
    "default_slos",
    "plain_alerts",
    "recording_name",
    "render",
    "rule_groups",
    "sli_alerts",
    "sli_rules",
    "worker_alerts",
    "write_rules",
]

RULES_FILENAME = "likes.rules.yml"
RUNBOOK_BASE = "runbooks"

# --- names other layers share: the workload names come from services/contracts/workloads.py
# (the services label their metrics with them through http.install(app, <name>)); the rest is
# defined here once, imported by the scrape config, Alertmanager's routes and the local stack.

# The label our code puts on its RED metrics: services/common/http.py RedMetrics labels every
# request `service=<name>`, the name given to http.install(app, <name>). The scrape relabeling
# must never write this label, or it would overwrite the code's value (review C5).
SERVICE_LABEL = "service"
# The label the scrape relabeling writes from the pod's app.kubernetes.io/name instead.
WORKLOAD_LABEL = "workload"
# Workload names (services/contracts/workloads.py `Workload.name`): the `service` label values.
WRITE = workloads.WRITE.name
READ = workloads.READ.name
HOTKEY_SAMPLER = workloads.HOTKEY_SAMPLER.name
OUTBOX_RELAY = workloads.OUTBOX_RELAY.name
AGGREGATOR = workloads.AGGREGATOR.name
HOTKEY_OPERATOR = workloads.HOTKEY_OPERATOR.name
CONSUMER_LAG = workloads.CONSUMER_LAG.name
ABUSE_SCORER = workloads.ABUSE_SCORER.name
WORKLOADS = tuple(w.name for w in workloads.ALL)

# `severity` values; Alertmanager routes on them (infra/observability.py alertmanager_config).
SEVERITY_PAGE = "page"
SEVERITY_TICKET = "ticket"
SEVERITY_NONE = "none"  # the Watchdog only: routed to the heartbeat, never to a person
SEVERITIES = (SEVERITY_PAGE, SEVERITY_TICKET, SEVERITY_NONE)
# The always-firing dead man's switch; Alertmanager routes it by this name.
WATCHDOG = "Watchdog"
CDN_PURGE_FAILING = "CdnPurgeFailing"
# The team an alert belongs to, when not the platform's on-call: Alertmanager routes its pages to
# that team's receiver (infra/observability.py alertmanager_config).
TEAM_LABEL = "team"
ABUSE_TEAM = "abuse"
OUTBOX_SHARDS_UNOWNED = "OutboxShardsUnowned"
WRITE_AVAILABILITY = "write-availability"  # the write SLO's name (its `slo` label)


@dataclass(frozen=True)
class Slo:
    """One SLO. `error_ratio` is PromQL with a `{window}` placeholder (a range like `5m`) that
    evaluates to the fraction of bad events (or bad minutes) over that window, as one series.
    The placeholder is replaced literally, so PromQL braces need no escaping."""

    name: str  # kebab-case; the `slo` label and, CamelCased, the alert name
    service: str
    objective: float  # e.g. 0.999: 0.1% of the events may be bad
    error_ratio: str
    description: str
    runbook: str  # slug of runbooks/<slug>.md
    # recording rules the error ratio reads, as (record, expr), emitted before the window ratios
    # with this SLO's labels: a time-based SLI records its per-evaluation good/bad bit once
    # instead of re-evaluating it inside a 3-day subquery
    inputs: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z][a-z0-9]*(-[a-z0-9]+)*", self.name):
            raise ValueError(f"Slo.name: {self.name!r} is not kebab-case")
        if not 0.0 < self.objective < 1.0:
            raise ValueError(f"Slo.objective: {self.objective} is not within (0, 1)")
        if "{window}" not in self.error_ratio:
            raise ValueError(f"Slo.error_ratio of {self.name}: no {{window}} placeholder")
        if not re.fullmatch(r"[a-z0-9-]+", self.runbook):
            raise ValueError(f"Slo.runbook: {self.runbook!r} is not a slug")

    @property
    def budget(self) -> float:
        return 1.0 - self.objective


@dataclass(frozen=True)
class BurnRateAlert:
    """Both windows must burn faster than `factor` times the budget rate for the alert to fire:
    the long window proves it is significant, the short one that it is still happening."""

    severity: str
    factor: float
    long_window: str
    short_window: str


# SRE Workbook table 5-8: 2% of a 30-day budget in 1 h, 5% in 6 h page; 10% in 3 d is a ticket.
BURN_RATE_ALERTS: tuple[BurnRateAlert, ...] = (
    BurnRateAlert(severity=SEVERITY_PAGE, factor=14.4, long_window="1h", short_window="5m"),
    BurnRateAlert(severity=SEVERITY_PAGE, factor=6.0, long_window="6h", short_window="30m"),
    BurnRateAlert(severity=SEVERITY_TICKET, factor=1.0, long_window="3d", short_window="6h"),
)
WINDOWS: tuple[str, ...] = ("5m", "30m", "1h", "6h", "3d")
# the error budget's period: the burn factors above spend it (14.4x for 1 h = 2% of 30 days)
SLO_PERIOD = "30d"


# the services' RED metrics (services/common/http.py); only API routes count, not /readyz
API_ROUTES = 'route=~"/v1/.+"'


def _requests_error_ratio(service: str, bad: str) -> str:
    """Bad requests over all API requests of a service: 0 while requests come and none is bad
    (a status never answered has no series, and nothing over something is 0, not no data);
    no series without requests."""
    api = f'{SERVICE_LABEL}="{service}",{API_ROUTES}'
    return (
        f"(sum(rate({metric_names.HTTP_REQUESTS}{{{api},{bad}}}[{{window}}])) or vector(0))\n"
        f"/\nsum(rate({metric_names.HTTP_REQUESTS}{{{api}}}[{{window}}]))"
    )


def _read_error_ratio() -> str:
    """Degraded post answers over all post answers, plus the gateway's 5xx over the requests it
    sent to the read service. Each term is 0 when it has no events (a denominator of 0 is
    dropped, not NaN) or no series (the read service down and unscraped; no gateway), so the
    other still counts: a gateway that cannot reach the service leaves the service idle."""
    m = metric_names
    tier = f'{m.READ_TIER_LABEL}=~"{m.READ_DEGRADED_TIER_RE}"'
    cluster = f'{m.ENVOY_CLUSTER_LABEL}="{m.GATEWAY_READ_CLUSTER}"'
    return (
        f"(\n  sum(rate({m.READ_TIER}{{{tier}}}[{{window}}]))\n"
        f"  /\n  (sum(rate({m.READ_TIER}[{{window}}])) > 0)\n  or vector(0)\n)\n+\n"
        f'(\n  sum(rate({m.ENVOY_CLUSTER_RQ_XX}{{{cluster},envoy_response_code_class="5"}}'
        f"[{{window}}]))\n"
        f"  /\n  (sum(rate({m.ENVOY_CLUSTER_RQ_COMPLETED}{{{cluster}}}[{{window}}])) > 0)\n"
        f"  or vector(0)\n)"
    )


def _write_error_ratio() -> str:
    """The gateway's 5xx over the requests it sent to the write service: the service's own 503s
    and the gateway's (no upstream, refused, timed out: a write service that is gone answers
    nothing itself), each counted once. With no gateway traffic (no gateway, or clients calling
    the service directly) the service's own 5xx over its requests."""
    m = metric_names
    cluster = f'{m.ENVOY_CLUSTER_LABEL}="{m.GATEWAY_WRITE_CLUSTER}"'
    service = _requests_error_ratio(WRITE, 'status=~"5.."')
    return (
        f'(\n  (sum(rate({m.ENVOY_CLUSTER_RQ_XX}{{{cluster},envoy_response_code_class="5"}}'
        f"[{{window}}])) or vector(0))\n"
        f"  /\n  (sum(rate({m.ENVOY_CLUSTER_RQ_COMPLETED}{{{cluster}}}[{{window}}])) > 0)\n)\n"
        f"or\n({service})"
    )


def _latency_error_ratio(service: str, le: str) -> str:
    """API requests slower than `le` seconds (a bucket boundary) over all API requests."""
    api = f'{SERVICE_LABEL}="{service}",{API_ROUTES}'
    hist = metric_names.HTTP_DURATION
    return (
        f"1 - (\n"
        f'  sum(rate({hist}_bucket{{{api},le="{le}"}}[{{window}}]))\n'
        f"  /\n  sum(rate({hist}_count{{{api}}}[{{window}}]))\n)"
    )


BAD_BIT = "slo:sli_bad:bool"


def _over_threshold(selector: str, threshold: int) -> tuple[str, str]:
    """1 when the worst series is above the threshold, else 0: recorded every evaluation, its
    average over a window is the fraction of bad time (lags have no request count)."""
    return (BAD_BIT, f"max({selector}) > bool {threshold}")


def _bad_time_ratio(slo_name: str) -> str:
    return f'avg_over_time({BAD_BIT}{{slo="{slo_name}"}}[{{window}}])'


# the seed's consumer_lag_seconds: the age of the oldest message each group has not consumed,
# per partition of likes.committed (services/consumer_lag/core.py computes it)
_COMMITTED_LAG = f'{metric_names.CONSUMER_LAG_SECONDS}{{topic="{events.COMMITTED}"}}'
CONSUMER_LAG_THRESHOLD_S = 10  # the seed: counts visibly stale after ~10 s of lag


def default_slos() -> list[Slo]:
    """The seed's SLIs that make sense as SLOs."""
    return [
        Slo(
            name="read-availability",
            service=READ,
            # the service never answers 5xx (it degrades to the last good value or null), so
            # the bad events are those degraded answers, and the requests that reached the
            # gateway but not the service (its 5xx: no upstream, refused, timed out)
            objective=0.9999,
            error_ratio=_read_error_ratio(),
            description="GET /v1/posts/{id}/likes and the batch read answer fresh: a degraded "
            "(last good or null) count, or a 5xx from the gateway, is bad",
            runbook="read-availability",
        ),
        Slo(
            name="read-latency",
            service=READ,
            # 100 ms is the seed's degraded p99 (count-cache down, counter-store fallback)
            objective=0.99,
            error_ratio=_latency_error_ratio(READ, "0.1"),
            description="reads answer within 100 ms",
            runbook="read-latency",
        ),
        Slo(
            name=WRITE_AVAILABILITY,
            service=WRITE,
            # a fail-closed 503 (idem-store or edge-store down) spends this budget, by design
            objective=0.999,
            error_ratio=_write_error_ratio(),
            description="POST /v1/likes answers without a 5xx",
            runbook="write-availability",
        ),
        Slo(
            name="write-latency",
            service=WRITE,
            objective=0.99,
            error_ratio=_latency_error_ratio(WRITE, "0.25"),
            description="POST /v1/likes answers within 250 ms",
            runbook="write-latency",
        ),
        Slo(
            name="consumer-lag",
            service=AGGREGATOR,
            # the seed: counts visibly stale after ~10 s of lag on likes.committed
            objective=0.99,
            error_ratio=_bad_time_ratio("consumer-lag"),
            # read from Kafka by the consumer-lag exporter (services/consumer_lag), per group
            # and partition: a consumer that died or hung keeps showing its lag
            inputs=(_over_threshold(_COMMITTED_LAG, CONSUMER_LAG_THRESHOLD_S),),
            description="likes.committed consumers stay within 10 s of the head",
            runbook="consumer-lag",
        ),
        Slo(
            name="cross-region-replication",
            service="mirrormaker2",
            objective=0.99,
            error_ratio=_bad_time_ratio("cross-region-replication"),
            # the seed's mm2_lag_seconds: MirrorMaker 2's own replication latency in ms, from
            # the JMX agent Strimzi runs with infra/jmx/mirrormaker2.yaml
            inputs=(_over_threshold(metric_names.MM2_REPLICATION_LATENCY_MAX, 60_000),),
            description="MirrorMaker 2 keeps the other region within 60 s",
            runbook="cross-region-replication",
        ),
    ]


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("-"))


def _percent(ratio: float) -> str:
    return f"{ratio * 100:.6g}%"


def alert_name(slo: Slo) -> str:
    return burn_alert_name(slo.name)


def burn_alert_name(slo_name: str) -> str:
    """The burn-rate alert of the SLO named `slo_name`."""
    return f"{_camel(slo_name)}BudgetBurn"


# The write SLO's burn alert, by name (alert_name of the write-availability Slo above)
WRITE_AVAILABILITY_BURN = burn_alert_name(WRITE_AVAILABILITY)


@dataclass(frozen=True)
class Inhibition:
    """While a `source` page fires, Alertmanager holds back `target` (infra/observability.py
    alertmanager_config renders it as an inhibit rule): one cause, one page. The target still
    shows in `likes alerts` as suppressed, and pages on its own once the source resolves."""

    source: str  # alert name; only its page-severity alerts inhibit
    target: str  # alert name
    why: str


INHIBITIONS = (
    Inhibition(
        WRITE_AVAILABILITY_BURN,
        OUTBOX_SHARDS_UNOWNED,
        # seen in the game days: a Cassandra cut paged twice, for the one store both live in
        "the relays' leases live in the edge-store: when it is down the writes burn (503s) and "
        "the leases lapse, and the write-availability runbook's first check is that store",
    ),
)


def recording_name(window: str) -> str:
    return f"slo:sli_error:ratio_rate{window}"


# each SLO's error ratio over the shortest window (label slo): what the runbooks look at first
ERROR_RATIO_NOW = recording_name(WINDOWS[0])


def _runbook_annotations(slug: str, runbook_base: str) -> dict[str, str]:
    return {"runbook": slug, "runbook_url": f"{runbook_base}/{slug}.md"}


def _recording_rules(slo: Slo) -> list[dict[str, Any]]:
    labels = {"slo": slo.name, SERVICE_LABEL: slo.service}
    inputs = [{"record": record, "expr": expr, "labels": labels} for record, expr in slo.inputs]
    return inputs + [
        {
            "record": recording_name(window),
            "expr": slo.error_ratio.replace("{window}", window),
            "labels": labels,
        }
        for window in WINDOWS
    ]


def _burn_rate_rules(slo: Slo, runbook_base: str) -> list[dict[str, Any]]:
    rules = []
    for burn in BURN_RATE_ALERTS:
        threshold = f"({burn.factor:g} * {slo.budget:.6g})"
        selector = f'{{slo="{slo.name}"}}'
        expr = (
            f"{recording_name(burn.long_window)}{selector} > {threshold}\n"
            f"and\n"
            f"{recording_name(burn.short_window)}{selector} > {threshold}"
        )
        rules.append(
            {
                "alert": alert_name(slo),
                "expr": expr,
                "labels": {
                    "severity": burn.severity,
                    "slo": slo.name,
                    SERVICE_LABEL: slo.service,
                    "long_window": burn.long_window,
                    "short_window": burn.short_window,
                },
                "annotations": {
                    "summary": (
                        f"{slo.name}: error budget burning at {burn.factor:g}x or faster over "
                        f"{burn.long_window} and {burn.short_window}"
                    ),
                    "description": (
                        f"{slo.description}. Error ratio over {burn.long_window}: "
                        "{{ $value | humanizePercentage }}; "
                        f"objective {_percent(slo.objective)}."
                    ),
                    **_runbook_annotations(slo.runbook, runbook_base),
                },
            }
        )
    return rules


DEAD_LETTER_DAILY_GROWTH = "DeadLetterDailyGrowth"
DEAD_LETTER_DAILY_LIMIT = 1000  # the seed: page when the DLQ's daily delta exceeds this


def plain_alerts(runbook_base: str = RUNBOOK_BASE) -> list[dict[str, Any]]:
    """The alerts the seed names that are not SLOs."""
    return [
        {
            # dead man's switch: always firing; Alertmanager posts it to the heartbeat receiver
            # (an external dead man's switch that pages when the posts stop arriving)
            "alert": WATCHDOG,
            "expr": "vector(1)",
            "labels": {"severity": SEVERITY_NONE},
            "annotations": {
                "summary": "Always firing: proves Prometheus -> Alertmanager -> pager works",
                **_runbook_annotations("watchdog", runbook_base),
            },
        },
        {
            # the seed: page when the DLQ's daily delta exceeds 1000 events; every consumer that
            # dead-letters counts its sends (likes_aggregator_dead_letter_total and the like)
            "alert": DEAD_LETTER_DAILY_GROWTH,
            "expr": (
                f'sum(increase({{__name__=~"{metric_names.DEAD_LETTERS}"}}[1d])) > '
                f"{DEAD_LETTER_DAILY_LIMIT}"
            ),
            "labels": {"severity": SEVERITY_PAGE, SERVICE_LABEL: AGGREGATOR},
            "annotations": {
                "summary": (
                    f"likes.dead-letter grew by more than {DEAD_LETTER_DAILY_LIMIT} events in a day"
                ),
                "description": (
                    "{{ $value }} events were dead-lettered in 24 h: usually a producer/consumer "
                    "version mismatch the registry did not catch."
                ),
                **_runbook_annotations("dead-letter-growth", runbook_base),
            },
        },
        {
            # The aggregator purges a post's CDN entry when its count changes; a purge given up
            # on (after its retries) leaves the CDN serving the old count until the entry's TTL
            # (5-30 s). Sustained for 15 minutes it is a broken token or a CDN outage: a ticket,
            # since every count still converges by TTL.
            "alert": CDN_PURGE_FAILING,
            "expr": f"sum(rate({metric_names.CDN_PURGE_FAILURES}[5m])) > 0",
            "for": "15m",
            "labels": {"severity": SEVERITY_TICKET, SERVICE_LABEL: AGGREGATOR},
            "annotations": {
                "summary": "CDN purges have been failing for 15 minutes",
                "description": (
                    "{{ $value | humanize }} purge calls/s given up on: cached counts stay "
                    "stale until their TTL. Check the Cloudflare token and API status."
                ),
                **_runbook_annotations("cdn-purge-failing", runbook_base),
            },
        },
        # Outbox shards nobody drains: the rows of likes whose direct publish failed wait there,
        # durable but never published, so never counted (invariant 1 delayed without bound; the
        # seed: "relay drains within 5 s"). A dead replica's shards are taken over within
        # seconds (RELAY_TAKEOVER_S) and a rolling update hands them over as fast, so 5 minutes
        # is a relay fleet that cannot take its leases: a page. Two rules, one alert: shards
        # the replicas report unowned, and no replica reporting at all (none running, or none
        # scraped), when every shard is undrained.
        {
            "alert": OUTBOX_SHARDS_UNOWNED,
            "expr": f"max({metric_names.OUTBOX_RELAY_UNOWNED_SHARDS}) > 0",
            "for": "5m",
            # `reason` tells the two rules' alerts apart (promtool refuses twin label sets)
            "labels": {
                "severity": SEVERITY_PAGE,
                SERVICE_LABEL: OUTBOX_RELAY,
                "reason": "shards-without-lease",
            },
            "annotations": {
                "summary": "Outbox shards have had no relay lease for 5 minutes",
                "description": (
                    "{{ $value }} outbox shard(s) have no relay replica draining them: likes "
                    "whose publish failed stay unpublished and uncounted until one takes them."
                ),
                **_runbook_annotations("outbox-shards-unowned", runbook_base),
            },
        },
        {
            "alert": OUTBOX_SHARDS_UNOWNED,
            "expr": f"absent({metric_names.OUTBOX_RELAY_UNOWNED_SHARDS})",
            "for": "5m",
            "labels": {
                "severity": SEVERITY_PAGE,
                SERVICE_LABEL: OUTBOX_RELAY,
                "reason": "no-relay-reporting",
            },
            "annotations": {
                "summary": "No outbox relay replica has reported its leases for 5 minutes",
                "description": (
                    "No relay replica is running (or none is scraped): no outbox shard is "
                    "drained, and likes whose publish failed stay unpublished and uncounted."
                ),
                **_runbook_annotations("outbox-shards-unowned", runbook_base),
            },
        },
        {
            # the seed: "spans dropped (alerted on otlp_export_failures)"
            "alert": TRACE_EXPORT_FAILING,
            "expr": f"{metric_names.OTLP_EXPORT_FAILURES} > 0",
            "for": "10m",
            "labels": {"severity": SEVERITY_TICKET, SERVICE_LABEL: otel_config.COLLECTOR},
            "annotations": {
                "summary": "The OTel Collector has been failing to export spans for 10 minutes",
                **_runbook_annotations("trace-export-failing", runbook_base),
            },
        },
    ]


# --- the seed's SLIs recorded from the datastores' exporters (infra/exporters.py) ------------
# Each formula is written once, here, and the alert that reads it sits beside it.

REDIS_SHARD_QPS_SKEW = "likes_redis_shard_qps_skew"
REPLICATION_LAG_SECONDS = "likes_replication_lag_seconds"
COUNT_CACHE_SKEW = "CountCacheShardSkew"
COUNT_CACHE_REPLICATION = "CountCacheReplicationLag"
# the redis job labels each Redis with the workload its pod is (infra/observability.py)
COUNT_CACHE_SELECTOR = f'{WORKLOAD_LABEL}="count-cache"'
# commands per second of each count-cache primary (a replica serves no reads here)
COUNT_CACHE_PRIMARY_OPS = (
    f"rate(redis_commands_processed_total{{{COUNT_CACHE_SELECTOR}}}[1m])\n"
    f'  and on (instance) redis_instance_info{{{COUNT_CACHE_SELECTOR},role="master"}}'
)
# below this many commands/s in all, skew is noise (one client's retries), not a hot shard
SKEW_FLOOR_OPS = 100
SKEW_THRESHOLD = 2.0  # max over mean cannot pass the primaries count: 3 locally, 12 in prod
REPLICATION_LAG_THRESHOLD_S = 10

# The idem-store never evicts (keys.EVICTION_POLICY): a full node refuses every write to its
# slots, and the write path fails a like closed (503) when it cannot record its idempotency key.
IDEM_STORE_NEARLY_FULL = "IdemStoreNearlyFull"
IDEM_STORE_SELECTOR = f'{WORKLOAD_LABEL}="idem-store"'
# per idem-store node, its used memory over its maxmemory (a node without a limit, as the local
# stack's, has no ratio)
IDEM_STORE_MEMORY_RATIO = (
    f"redis_memory_used_bytes{{{IDEM_STORE_SELECTOR}}}\n"
    f"  / on (instance) (redis_memory_max_bytes{{{IDEM_STORE_SELECTOR}}} > 0)"
)
IDEM_STORE_FULL_RATIO = 0.85

# the canary (services/canary/core.py): a turn is a like or unlike through the gateway, then the
# count read for the convergence hold and judged against the edge-store's truth
TRACE_EXPORT_FAILING = "TraceExportFailing"
CANARY_DRIFT = "CanaryDrift"
COUNT_FLICKER = "CountFlicker"
CANARY_FAILING = "CanaryFailing"
CANARY = workloads.CANARY.name
_TURNS = metric_names.CANARY_TURNS
CANARY_DRIFT_THRESHOLD = 0.2  # a fifth of the judged turns still wrong after the hold


def sli_rules() -> list[dict[str, Any]]:
    """redis_shard_qps_skew: the busiest count-cache primary's commands/s over the primaries'
    mean (1 = even; a hot key that key-splitting and the hot pools missed shows as one shard far
    above the rest). replication_lag_seconds: per count-cache primary, the worst of its replicas'
    `lag` (seconds since the replica last acknowledged; a healthy replica acks every second, so
    0-1): what a failover to that replica would lose. The cross-region cell lag joins it when a
    second region exists (issue 11)."""
    return [
        {
            "record": REDIS_SHARD_QPS_SKEW,
            "expr": (
                f"max(\n  {COUNT_CACHE_PRIMARY_OPS}\n)\n/\navg(\n  {COUNT_CACHE_PRIMARY_OPS}\n) > 0"
            ),
            "labels": {WORKLOAD_LABEL: "count-cache"},
        },
        {
            "record": REPLICATION_LAG_SECONDS,
            "expr": (
                f"max by (instance) (redis_connected_slave_lag_seconds{{{COUNT_CACHE_SELECTOR}}})"
            ),
            "labels": {WORKLOAD_LABEL: "count-cache"},
        },
        # canary_drift_ratio: of the canary's judged turns (errors are not judged), the share
        # whose count still differed from the edge-store's truth after the convergence hold
        # (0 when none did, though a canary that never drifted has no drift series)
        {
            "record": metric_names.CANARY_DRIFT_RATIO,
            "expr": (
                f'(sum(rate({_TURNS}{{result="drift"}}[15m])) or vector(0))\n/\n'
                f'(sum(rate({_TURNS}{{result=~"match|drift"}}[15m])) > 0)'
            ),
            "labels": {WORKLOAD_LABEL: CANARY},
        },
        # traces_kept_per_second: traces the samplers' tail sampling kept (errors, slow ones
        # and the healthy share), over every sampler replica
        {
            "record": metric_names.TRACES_KEPT_PER_SECOND,
            "expr": f'sum(rate({metric_names.OTELCOL_TRACES_SAMPLED}{{sampled="true"}}[5m]))',
            "labels": {WORKLOAD_LABEL: otel_config.SAMPLER},
        },
        # otlp_export_failures: spans per second a collector's exporter gave up on (Tempo
        # refused or unreachable past the retry budget, or a tier's routing failed): dropped
        # traces; 0 while every collector exports (a collector with no failure has no series)
        {
            "record": metric_names.OTLP_EXPORT_FAILURES,
            "expr": (
                f"sum(rate({metric_names.OTELCOL_SEND_FAILED_SPANS}[5m]))\n"
                f'  or on () (0 * sum(up{{{WORKLOAD_LABEL}=~"{otel_config.COLLECTOR}|'
                f'{otel_config.SAMPLER}"}}))'
            ),
            "labels": {WORKLOAD_LABEL: otel_config.COLLECTOR},
        },
        # count_flicker_per_user: reads after one's own like that showed a count below one
        # already seen, per reading user and hour (each canary replica reads as one user)
        {
            "record": metric_names.COUNT_FLICKER_PER_USER,
            "expr": (
                f"sum(increase({metric_names.CANARY_FLICKERS}[1h]))\n/\n"
                f"count({metric_names.CANARY_FLICKERS})"
            ),
            "labels": {WORKLOAD_LABEL: CANARY},
        },
    ]


def sli_alerts(runbook_base: str = RUNBOOK_BASE) -> list[dict[str, Any]]:
    """Tickets: a skewed or lagging count-cache degrades reads (a saturated shard's reads fall
    through to the counter-store; a failover loses the lagged aggregates, which the aggregator's
    next window rewrites from the cells), it loses no like. A page: an idem-store node near its
    maxmemory, before it refuses the likes of its slots."""
    return [
        {
            "alert": COUNT_CACHE_SKEW,
            "expr": (
                f"{REDIS_SHARD_QPS_SKEW} > {SKEW_THRESHOLD:g}\n"
                f"and on () sum({COUNT_CACHE_PRIMARY_OPS}) > {SKEW_FLOOR_OPS}"
            ),
            "for": "10m",
            "labels": {"severity": SEVERITY_TICKET, SERVICE_LABEL: "count-cache"},
            "annotations": {
                "summary": "One count-cache primary has served 2x the mean load for 10 minutes",
                "description": (
                    "redis_shard_qps_skew {{ $value | humanize }}: a hot post is reaching its "
                    "shard instead of the hot pools. Check `likes hotkeys` and the sampler."
                ),
                **_runbook_annotations("count-cache-shard-skew", runbook_base),
            },
        },
        {
            "alert": COUNT_CACHE_REPLICATION,
            "expr": f"max({REPLICATION_LAG_SECONDS}) > {REPLICATION_LAG_THRESHOLD_S}",
            "for": "5m",
            "labels": {
                "severity": SEVERITY_TICKET,
                SERVICE_LABEL: "count-cache",
                "reason": "replica-lagging",
            },
            "annotations": {
                "summary": "A count-cache replica has lagged its primary by over 10 s for 5 min",
                "description": (
                    "replication_lag_seconds {{ $value }}: a failover now would lose that much "
                    "of the aggregates (rewritten from the counter-store cells next window)."
                ),
                **_runbook_annotations("count-cache-replication-lag", runbook_base),
            },
        },
        {
            # a primary whose replica is gone reports no lag at all: count the replicas instead
            "alert": COUNT_CACHE_REPLICATION,
            "expr": (
                "min(redis_connected_slaves{"
                + COUNT_CACHE_SELECTOR
                + "}\n  and on (instance) redis_instance_info{"
                + COUNT_CACHE_SELECTOR
                + ',role="master"}) < 1'
            ),
            "for": "5m",
            "labels": {
                "severity": SEVERITY_TICKET,
                SERVICE_LABEL: "count-cache",
                "reason": "primary-without-replica",
            },
            "annotations": {
                "summary": "A count-cache primary has had no replica for 5 minutes",
                "description": (
                    "A second failure of that primary would leave its slots without a node: "
                    "reads of those posts fall through to the counter-store until it is back."
                ),
                **_runbook_annotations("count-cache-replication-lag", runbook_base),
            },
        },
        {
            "alert": IDEM_STORE_NEARLY_FULL,
            "expr": f"max by (instance) ({IDEM_STORE_MEMORY_RATIO}) > {IDEM_STORE_FULL_RATIO:g}",
            "for": "5m",
            # a page before the outage: full, the node fails every like of its slots
            "labels": {"severity": SEVERITY_PAGE, SERVICE_LABEL: "idem-store"},
            "annotations": {
                "summary": "An idem-store node has used over 85 % of its maxmemory for 5 minutes",
                "description": (
                    "{{ $labels.instance }} at {{ $value | humanizePercentage }}: it never "
                    "evicts, so once full every like whose key hashes to its slots is refused "
                    "(503) until keys expire or the cluster grows."
                ),
                **_runbook_annotations("idem-store-nearly-full", runbook_base),
            },
        },
        *_canary_alerts(runbook_base),
    ]


def _canary_alerts(runbook_base: str) -> list[dict[str, Any]]:
    """Drift pages: the counts users see are wrong well after the data path had time to fold
    them. A flicker is a ticket (a client-visible glitch, nothing lost). A canary that cannot
    judge (its calls fail) or is not running leaves both SLIs blind: a ticket."""
    return [
        {
            "alert": CANARY_DRIFT,
            "expr": f"{metric_names.CANARY_DRIFT_RATIO} > {CANARY_DRIFT_THRESHOLD:g}",
            "for": "10m",
            "labels": {"severity": SEVERITY_PAGE, SERVICE_LABEL: CANARY},
            "annotations": {
                "summary": "The read path answers canary counts other than the truth",
                "description": (
                    "canary_drift_ratio {{ $value | humanizePercentage }}: that share of the "
                    "canary's likes and unlikes still read wrong after the convergence hold."
                ),
                **_runbook_annotations("canary-drift", runbook_base),
            },
        },
        {
            "alert": COUNT_FLICKER,
            "expr": f"{metric_names.COUNT_FLICKER_PER_USER} > 0",
            "for": "30m",
            "labels": {"severity": SEVERITY_TICKET, SERVICE_LABEL: CANARY},
            "annotations": {
                "summary": "A reader saw a count drop after their own like",
                "description": (
                    "count_flicker_per_user {{ $value }} per hour: after its own like the "
                    "canary read a count below one it had already seen."
                ),
                **_runbook_annotations("count-flicker", runbook_base),
            },
        },
        {
            "alert": CANARY_FAILING,
            "expr": (
                f'sum(rate({_TURNS}{{result="error"}}[15m]))\n/\nsum(rate({_TURNS}[15m])) > 0.5'
            ),
            "for": "15m",
            "labels": {"severity": SEVERITY_TICKET, SERVICE_LABEL: CANARY, "reason": "errors"},
            "annotations": {
                "summary": "Most canary turns fail before they can be judged",
                "description": (
                    "The canary's writes, reads or truth reads fail (its log names the step): "
                    "canary_drift_ratio and count_flicker_per_user are blind meanwhile."
                ),
                **_runbook_annotations("canary-failing", runbook_base),
            },
        },
        {
            "alert": CANARY_FAILING,
            "expr": f'absent(up{{{WORKLOAD_LABEL}="{CANARY}"}} == 1)',
            "for": "10m",
            "labels": {
                "severity": SEVERITY_TICKET,
                SERVICE_LABEL: CANARY,
                "reason": "not-running",
            },
            "annotations": {
                "summary": "No canary has been scraped for 10 minutes",
                "description": "canary_drift_ratio and count_flicker_per_user are blind.",
                **_runbook_annotations("canary-failing", runbook_base),
            },
        },
    ]


# --- the workers: stopped, hung, failing (the seed's "alerted" failure modes) -------------------

CONSUMER_LAG_UNKNOWN = "ConsumerLagUnknown"
AGGREGATOR_STALLED = "AggregatorStalled"
OUTBOX_RELAY_HUNG = "OutboxRelayHung"
OUTBOX_EVENTS_STALE = "OutboxEventsStale"
DEAD_LETTER_UNAVAILABLE = "DeadLetterUnavailable"
AGGREGATOR_FLUSH_FAILING = "AggregatorFlushFailing"
AGGREGATOR_COMMIT_FAILING = "AggregatorCommitFailing"
READ_BREAKER_OPEN = "ReadBreakerOpen"
# a loop that has not gone round for this long is hung (its liveness probe restarts it after
# worker_http.LoopHealth's 120 s: the alert is for a restart that did not help)
LOOP_HUNG_AFTER_S = 60
# an outbox row is the relay's after RELAY_REPUBLISH_AFTER_S; a dead replica's shards are taken
# over within RELAY_TAKEOVER_S and a publish gives up after RELAY_PUBLISH_TIMEOUT_S. Twice that
# path is the relay's drain budget: a row older than this is one no relay is getting out.
OUTBOX_DRAIN_BUDGET_S = round(
    2
    * (
        convergence.RELAY_REPUBLISH_AFTER_S
        + convergence.RELAY_TAKEOVER_S
        + convergence.RELAY_PUBLISH_TIMEOUT_S
    )
)


def _alert(
    name: str,
    expr: str,
    *,
    severity: str,
    service: str,
    summary: str,
    description: str,
    runbook: str,
    runbook_base: str,
    for_: str | None = None,
    reason: str | None = None,
    team: str | None = None,
) -> dict[str, Any]:
    labels = {"severity": severity, SERVICE_LABEL: service}
    if reason is not None:
        labels["reason"] = reason  # tells apart two rules of one alert
    if team is not None:
        labels[TEAM_LABEL] = team
    rule: dict[str, Any] = {"alert": name, "expr": expr}
    if for_ is not None:
        rule["for"] = for_
    rule["labels"] = labels
    rule["annotations"] = {
        "summary": summary,
        "description": description,
        **_runbook_annotations(runbook, runbook_base),
    }
    return rule


def worker_alerts(runbook_base: str = RUNBOOK_BASE) -> list[dict[str, Any]]:
    """A worker that stopped shows as a target not up (absent series); one that hung while its
    ops thread still answers, as a heartbeat timestamp that stops moving (compared with
    `time()`, never a frozen gauge read as if current); one that fails, as its failure counters."""
    agg_up = f'up{{{WORKLOAD_LABEL}="{AGGREGATOR}"}}'
    return [
        _alert(
            CONSUMER_LAG_UNKNOWN,
            # no series at all (the exporter is down, or no broker answers it), or partitions
            # it cannot read (a broker that leads them, or a group's coordinator, is silent)
            f"absent({metric_names.CONSUMER_LAG_SECONDS})"
            f" or max({metric_names.CONSUMER_LAG_UNREAD}) > 0",
            for_="5m",
            severity=SEVERITY_TICKET,
            service=workloads.CONSUMER_LAG.name,
            summary="Consumer lag has not been known for 5 minutes",
            description=(
                "The consumer-lag exporter exports nothing, or not every partition's lag: it "
                f"is down, or a broker does not answer it ({metric_names.CONSUMER_LAG_UNREAD} "
                "counts the partitions it cannot read). The consumer-lag SLO and its alerts "
                "are blind to those partitions meanwhile."
            ),
            runbook="consumer-lag-unknown",
            runbook_base=runbook_base,
        ),
        _alert(
            AGGREGATOR_STALLED,
            f"absent({agg_up} == 1)",
            for_="5m",
            severity=SEVERITY_PAGE,
            service=AGGREGATOR,
            reason="not-running",
            summary="No aggregator replica has been up for 5 minutes",
            description=(
                "No aggregator is scraped up: nothing is counted. Likes are accepted and wait "
                "in likes.committed; counts stay where they were."
            ),
            runbook="aggregator-stalled",
            runbook_base=runbook_base,
        ),
        _alert(
            AGGREGATOR_STALLED,
            f"time() - {metric_names.AGGREGATOR_LOOP_TIMESTAMP} > {LOOP_HUNG_AFTER_S}",
            for_="2m",
            severity=SEVERITY_PAGE,
            service=AGGREGATOR,
            reason="loop-hung",
            summary="An aggregator's consumer loop has not turned for over a minute",
            description=(
                "{{ $labels.instance }} answers scrapes but its loop last went round "
                "{{ $value | humanizeDuration }} ago: its partitions are not consumed."
            ),
            runbook="aggregator-stalled",
            runbook_base=runbook_base,
        ),
        _alert(
            OUTBOX_RELAY_HUNG,
            f"time() - {metric_names.OUTBOX_RELAY_LOOP_TIMESTAMP} > {LOOP_HUNG_AFTER_S}",
            for_="2m",
            severity=SEVERITY_PAGE,
            service=OUTBOX_RELAY,
            summary="An outbox relay's loop has not turned for over a minute",
            description=(
                "{{ $labels.instance }} answers scrapes but its loop last went round "
                "{{ $value | humanizeDuration }} ago: the shards it leased wait for their "
                "leases to lapse."
            ),
            runbook="outbox-relay-hung",
            runbook_base=runbook_base,
        ),
        _alert(
            OUTBOX_EVENTS_STALE,
            f"max({metric_names.OUTBOX_OLDEST_AGE}) > {OUTBOX_DRAIN_BUDGET_S}",
            for_="5m",
            severity=SEVERITY_PAGE,
            service=OUTBOX_RELAY,
            summary=f"Outbox rows older than the relay's {OUTBOX_DRAIN_BUDGET_S} s drain budget",
            description=(
                "The oldest unpublished outbox row is {{ $value | humanizeDuration }} old: "
                "likes whose direct publish failed are durable but not counted yet."
            ),
            runbook="outbox-events-stale",
            runbook_base=runbook_base,
        ),
        _alert(
            DEAD_LETTER_UNAVAILABLE,
            f'sum(increase({{__name__=~"{metric_names.DEAD_LETTER_FAILURES}"}}[10m])) > 0',
            severity=SEVERITY_PAGE,
            service=AGGREGATOR,
            summary="The dead-letter topic refused sends in the last 10 minutes",
            description=(
                "{{ $value }} dead-letter sends failed: the aggregator logged those poison "
                "messages in full and skipped them (recover them from its log); the relay "
                "keeps its rows and retries."
            ),
            runbook="dead-letter-unavailable",
            runbook_base=runbook_base,
        ),
        _alert(
            AGGREGATOR_FLUSH_FAILING,
            f"sum(rate({metric_names.AGGREGATOR_FLUSH_FAILURES}[5m])) > 0",
            for_="5m",
            severity=SEVERITY_PAGE,
            service=AGGREGATOR,
            summary="Aggregator window flushes have been failing for 5 minutes",
            description=(
                "{{ $value | humanize }} failed flushes/s: the window is retried with its "
                "offsets uncommitted, so counts stand still until a flush succeeds."
            ),
            runbook="aggregator-flush-failing",
            runbook_base=runbook_base,
        ),
        _alert(
            AGGREGATOR_COMMIT_FAILING,
            f"sum(rate({metric_names.AGGREGATOR_COMMIT_FAILURES}[5m])) > 0",
            for_="10m",
            severity=SEVERITY_TICKET,
            service=AGGREGATOR,
            summary="Aggregator offset commits have been failing for 10 minutes",
            description=(
                "The cells are written, the offsets not: a restart or rebalance replays "
                "those windows (the cells' offsets skip them), longer the longer it lasts."
            ),
            runbook="aggregator-commit-failing",
            runbook_base=runbook_base,
        ),
        _alert(
            READ_BREAKER_OPEN,
            f"max by (instance, dependency) ({metric_names.READ_BREAKER_OPEN}) > 0",
            for_="5m",
            severity=SEVERITY_TICKET,
            service=READ,
            summary="A read replica's breaker has been open for 5 minutes",
            description=(
                "{{ $labels.instance }} has not called {{ $labels.dependency }} for 5 "
                "minutes: its reads answer from the fallback (counter-store or last good)."
            ),
            runbook="read-breaker-open",
            runbook_base=runbook_base,
        ),
    ]


ABUSE_STORM = "AbuseStorm"
ABUSE_SCORING_STALLED = "AbuseScoringStalled"
ABUSE_MODEL_ERRORS = "AbuseModelErrors"
# the share of Score calls the model server refuses (any code but OK) that files a ticket: a
# scorer and a model of different builds (INVALID_ARGUMENT), a server with no model (UNAVAILABLE)
ABUSE_MODEL_REFUSED_RATIO = 0.05
ABUSE_MODEL_MAX_AGE_S = workloads.MODEL_MAX_AGE_S  # older than this since training: stale
# a ring, not a lone bot: the write path already holds each degraded account to a like a minute
ABUSE_STORM_ACCOUNTS = 5
ABUSE_STORM_WINDOW = "10m"  # services/contracts/degrade.py STORM_WINDOW_S


def abuse_alerts(runbook_base: str = RUNBOOK_BASE) -> list[dict[str, Any]]:
    """The abuse team's: a storm (accounts degraded by the dozen) pages them; a scorer that
    stopped scoring (its model or a store away, its loop hung, no replica) files them a ticket,
    since the likes it misses meanwhile are voided once it scores again (counts stay exact); so
    does a model server that refuses Score calls or cannot load the version published as
    current (a bad publish: the previous version serves on), or serves one older than
    workloads.MODEL_MAX_AGE_S (the weekly publish did not happen)."""
    up = f'up{{{WORKLOAD_LABEL}="{ABUSE_SCORER}"}}'
    common: dict[str, Any] = {"service": ABUSE_SCORER, "team": ABUSE_TEAM,
                              "runbook_base": runbook_base}  # fmt: skip
    stalled: dict[str, Any] = {**common, "severity": SEVERITY_TICKET,
                               "runbook": "abuse-scoring-stalled"}  # fmt: skip
    model_errors: dict[str, Any] = {**common, "severity": SEVERITY_TICKET,
                                    "runbook": "abuse-model-errors"}  # fmt: skip
    return [
        _alert(
            ABUSE_STORM,
            f"sum(increase({metric_names.ABUSE_DEGRADED}[{ABUSE_STORM_WINDOW}])) "
            f">= {ABUSE_STORM_ACCOUNTS}",
            severity=SEVERITY_PAGE,
            summary=f"A storm of bot likes: accounts degraded in the last {ABUSE_STORM_WINDOW}",
            description=(
                "{{ $value | humanize }} accounts had their likes voided again and again and "
                "were degraded to one like a minute: a bot ring is at work (or a bad model "
                "is voiding humans: check which model version voids)."
            ),
            runbook="abuse-storm",
            **common,
        ),
        _alert(
            ABUSE_SCORING_STALLED,
            f"max({metric_names.ABUSE_DEFERRED}) == 1",
            for_="10m",
            reason="deferred",
            summary="The abuse scorer has been holding a batch for 10 minutes",
            description=(
                "Scoring waits for the model server or a store: bot likes are counted "
                "meanwhile and voided once it scores again."
            ),
            **stalled,
        ),
        _alert(
            ABUSE_SCORING_STALLED,
            f"time() - {metric_names.ABUSE_LOOP_TIMESTAMP} > {LOOP_HUNG_AFTER_S}",
            for_="2m",
            reason="loop-hung",
            summary="The abuse scorer's loop has not turned for over a minute",
            description=(
                "{{ $labels.instance }} answers scrapes but its loop last went round "
                "{{ $value | humanizeDuration }} ago: likes.committed is not scored."
            ),
            **stalled,
        ),
        _alert(
            ABUSE_SCORING_STALLED,
            f"absent({up} == 1)",
            for_="10m",
            reason="not-running",
            summary="No abuse scorer has been up for 10 minutes",
            description=(
                "Nothing scores likes.committed: bot likes are counted until a scorer runs "
                "again and voids them (Kafka's retention holds what it has to read)."
            ),
            **stalled,
        ),
        _alert(
            ABUSE_MODEL_ERRORS,
            f'sum(rate({metric_names.ABUSE_MODEL_CALLS}{{code!="OK"}}[5m])) '
            f"/ sum(rate({metric_names.ABUSE_MODEL_CALLS}[5m])) > {ABUSE_MODEL_REFUSED_RATIO}",
            for_="5m",
            reason="refused",
            summary="The abuse model server refuses over "
            f"{ABUSE_MODEL_REFUSED_RATIO:.0%} of Score calls",
            description=(
                "{{ $value | humanizePercentage }} of Score calls got no probabilities for 5 "
                "minutes: the batches they carried wait, and their bot likes are counted "
                "meanwhile."
            ),
            **model_errors,
        ),
        _alert(
            ABUSE_MODEL_ERRORS,
            f"max by (version) ({metric_names.ABUSE_MODEL_LOAD_FAILING}) == 1",
            for_="5m",
            reason="load-failed",
            summary="The current abuse model version does not load",
            description=(
                "current names {{ $labels.version }}, which the model servers cannot load: "
                "they serve the version they had (or nothing, after a restart)."
            ),
            **model_errors,
        ),
        _alert(
            ABUSE_MODEL_ERRORS,
            f"time() - min({metric_names.ABUSE_MODEL_TRAINED}) > {ABUSE_MODEL_MAX_AGE_S}",
            for_="30m",
            reason="stale",
            summary="The abuse model serving is older than a week and a day",
            description=(
                "A model server serves a version trained {{ $value | humanizeDuration }} ago: "
                "the weekly publishing job failed, or its gate refused what it trained. The "
                "model still scores; it learns nothing new."
            ),
            **model_errors,
        ),
    ]


def rule_groups(slos: list[Slo], *, runbook_base: str = RUNBOOK_BASE) -> dict[str, Any]:
    """A Prometheus rules file: one group per SLO, its recording rules before its alerts (a group
    evaluates in order, so the alerts read this cycle's ratios), then the plain alerts."""
    names = [slo.name for slo in slos]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate SLO names: {names}")
    groups: list[dict[str, Any]] = [
        {
            "name": f"slo-{slo.name}",
            "rules": _recording_rules(slo) + _burn_rate_rules(slo, runbook_base),
        }
        for slo in slos
    ]
    groups.append({"name": "likes-slis", "rules": sli_rules() + sli_alerts(runbook_base)})
    groups.append({"name": "likes-alerts", "rules": plain_alerts(runbook_base)})
    groups.append({"name": "likes-workers", "rules": worker_alerts(runbook_base)})
    groups.append({"name": "likes-abuse", "rules": abuse_alerts(runbook_base)})
    return {"groups": groups}


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True  # a rules file reads better without &id001 anchors


def _str_presenter(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    # multi-line PromQL stays readable in review as a literal block
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str_presenter)

_HEADER = "# Generated by `python -m infra.alert_rules infra/rules`; do not edit by hand.\n"


def render(groups: dict[str, Any]) -> str:
    return _HEADER + yaml.dump(groups, Dumper=_Dumper, sort_keys=False, width=100)


def write_rules(path: Path | str, slos: list[Slo] | None = None) -> Path:
    """Write the rules file (into `path` if it is a directory); returns the file written."""
    target = Path(path)
    if target.is_dir():
        target = target / RULES_FILENAME
    target.write_text(render(rule_groups(default_slos() if slos is None else slos)))
    return target


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m infra.alert_rules OUTDIR", file=sys.stderr)
        return 2
    outdir = Path(argv[0])
    outdir.mkdir(parents=True, exist_ok=True)
    print(write_rules(outdir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
