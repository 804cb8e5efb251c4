"""Dashboards as code: seven Grafana dashboards (edge, write, read, stream, hot keys, control plane,
abuse) built with grafana-foundation-sdk, provisioned read-only from a ConfigMap
(infra/observability.py).

Every panel query reads a metric name from where it is defined once: our own from
services/contracts/metrics.py, the SLO recordings from infra/alert_rules.py; the exporters' names
(Envoy, redis_exporter, the JMX rules, etcd, Prometheus, Alertmanager) are theirs.
tests/integration/test_dashboards.py runs every query of the rendered ConfigMap on the local
Prometheus after `likes local demo` and fails on any that returns nothing.

A query is written so that "nothing is wrong" is a 0, not "No data": failure counters are
unlabelled or bound to their known labels at start (e.g. the read service's dependencies).
`python -m infra.dashboards DIR` writes the JSON files, to import into any Grafana.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.builders import prometheus as gp
from grafana_foundation_sdk.builders import stat as gs
from grafana_foundation_sdk.builders import timeseries as gt
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as dm

from infra import alert_rules
from services.contracts import metrics as m

__all__ = [
    "BOARDS",
    "CONFIG_MAP",
    "DATASOURCE_UID",
    "MOUNT_PATH",
    "RATE_INTERVAL",
    "Board",
    "Panel",
    "Query",
    "build",
    "render",
]

CONFIG_MAP = "grafana-dashboards"  # one `<uid>.json` key per dashboard
MOUNT_PATH = "/var/lib/grafana/dashboards"  # where Grafana's file provider reads them
DATASOURCE_UID = "prometheus"  # the provisioned Prometheus datasource's uid
RATE_INTERVAL = "$__rate_interval"  # Grafana's: at least four scrape intervals
RI = RATE_INTERVAL

Unit = str  # a Grafana unit id: "reqps", "s", "ms", "percentunit", "short", "bytes", "ops"


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""


@dataclass(frozen=True)
class Panel:
    title: str
    unit: Unit
    queries: tuple[Query, ...]
    description: str = ""
    kind: Literal["timeseries", "stat"] = "timeseries"


@dataclass(frozen=True)
class Board:
    uid: str
    title: str
    description: str
    rows: tuple[tuple[str, tuple[Panel, ...]], ...]


def q(expr: str, legend: str = "") -> Query:
    return Query(expr, legend)


def panel(title: str, unit: Unit, *queries: Query, description: str = "") -> Panel:
    return Panel(title, unit, tuple(queries), description)


def stat(title: str, unit: Unit, *queries: Query, description: str = "") -> Panel:
    return Panel(title, unit, tuple(queries), description, kind="stat")


# --- shared query shapes ---------------------------------------------------------------------
def _api(service: str) -> str:
    """The service's API requests (as the SLOs count them: not /readyz, not /metrics)."""
    return f'{alert_rules.SERVICE_LABEL}="{service}",{alert_rules.API_ROUTES}'


def _p50_p99(bucket: str) -> tuple[Query, ...]:
    """The p50 and p99 of histogram series `bucket` (a `_bucket` selector), one query each."""
    return tuple(
        q(f"histogram_quantile({p}, sum by (le) (rate({bucket}[{RI}])))", f"p{label}")
        for p, label in ((0.5, "50"), (0.99, "99"))
    )


def _red(service: str) -> tuple[Panel, ...]:
    sel = _api(service)
    hist = f"{m.HTTP_DURATION}_bucket{{{sel}}}"
    return (
        panel(
            "Requests by status",
            "reqps",
            q(f"sum by (status) (rate({m.HTTP_REQUESTS}{{{sel}}}[{RI}]))", "{{status}}"),
        ),
        panel("Latency", "s", *_p50_p99(hist)),
        panel(
            "Requests by route",
            "reqps",
            q(f"sum by (route) (rate({m.HTTP_REQUESTS}{{{sel}}}[{RI}]))", "{{route}}"),
        ),
    )


def _burn(service: str) -> Panel:
    """Each SLO of the service: its error ratio over 5 m and 1 h divided by its budget (1 = the
    budget spent exactly over the period; the page fires at 14.4 over both 1 h and 5 m)."""
    queries = []
    for slo in alert_rules.default_slos():
        if slo.service != service:
            continue
        budget = round(1 - slo.objective, 10)
        for window in ("5m", "1h"):
            rec = alert_rules.recording_name(window)
            queries.append(q(f'{rec}{{slo="{slo.name}"}} / {budget}', f"{slo.name} {window}"))
    return panel("Error-budget burn rate", "short", *queries, description=_burn.__doc__ or "")


# --- the boards ------------------------------------------------------------------------------
_COUNT_CACHE = alert_rules.COUNT_CACHE_SELECTOR
_ENVOY_5XX = 'envoy_response_code_class="5"'
_BY_CLUSTER = f"sum by ({m.ENVOY_CLUSTER_LABEL})"
_CLUSTER_COMPLETED = f"{_BY_CLUSTER} (rate({m.ENVOY_CLUSTER_RQ_COMPLETED}[{RI}]))"
_CLUSTER_5XX = f"{_BY_CLUSTER} (rate({m.ENVOY_CLUSTER_RQ_XX}{{{_ENVOY_5XX}}}[{RI}]))"

EDGE = Board(
    "likes-edge",
    "Likes / Edge",
    "The gateway (Envoy): what clients sent, what each upstream cluster answered and how fast.",
    (
        (
            "Gateway",
            (
                panel(
                    "Downstream requests by class",
                    "reqps",
                    q(
                        "sum by (envoy_response_code_class) "
                        f"(rate(envoy_http_downstream_rq_xx[{RI}]))",
                        "{{envoy_response_code_class}}xx",
                    ),
                ),
                panel(
                    "Upstream requests by cluster",
                    "reqps",
                    q(
                        _CLUSTER_COMPLETED,
                        f"{{{{{m.ENVOY_CLUSTER_LABEL}}}}}",
                    ),
                ),
                panel(
                    "Upstream 5xx share by cluster",
                    "percentunit",
                    q(
                        f"(\n  {_CLUSTER_5XX}\n  or {_CLUSTER_COMPLETED} * 0\n)\n"
                        f"/\n({_CLUSTER_COMPLETED} > 0)",
                        f"{{{{{m.ENVOY_CLUSTER_LABEL}}}}}",
                    ),
                    description="Includes what Envoy could not deliver (no upstream, timeout). "
                    "A cluster that never answered 5xx has no 5xx series: 0.",
                ),
                panel(
                    "Upstream p99 latency by cluster",
                    "ms",
                    q(
                        "histogram_quantile(0.99, sum by (le, envoy_cluster_name) "
                        f"(rate(envoy_cluster_upstream_rq_time_bucket[{RI}])))",
                        f"{{{{{m.ENVOY_CLUSTER_LABEL}}}}}",
                    ),
                ),
            ),
        ),
    ),
)

WRITE = Board(
    "likes-write",
    "Likes / Write path",
    "The write service and the outbox relay that publishes its committed likes to Kafka.",
    (
        ("Write service", (*_red(alert_rules.WRITE), _burn(alert_rules.WRITE))),
        (
            "Outbox relay",
            (
                panel(
                    "Outbox backlog",
                    "short",
                    q(f"sum({m.OUTBOX_BACKLOG})", "waiting"),
                ),
                panel(
                    "Oldest unpublished outbox event",
                    "s",
                    q(f"max({m.OUTBOX_OLDEST_AGE})", "age"),
                ),
                panel(
                    "Published and failed",
                    "ops",
                    q(f"sum(rate({m.OUTBOX_PUBLISHED}[{RI}]))", "published"),
                    q(f"sum(rate({m.OUTBOX_PUBLISH_FAILURES}[{RI}]))", "failed"),
                ),
                panel(
                    "Relay shards",
                    "short",
                    q(f"sum({m.OUTBOX_RELAY_OWNED_SHARDS})", "owned"),
                    q(f"max({m.OUTBOX_RELAY_UNOWNED_SHARDS})", "unowned"),
                    q(f"max({m.OUTBOX_RELAY_MEMBERS})", "members"),
                ),
            ),
        ),
    ),
)

_TIER = m.READ_TIER_LABEL
READ = Board(
    "likes-read",
    "Likes / Read path",
    "The read service: answers by the tier that served them, its dependencies and breakers.",
    (
        ("Read service", (*_red(alert_rules.READ), _burn(alert_rules.READ))),
        (
            "Tiers and dependencies",
            (
                panel(
                    "Post counts answered by tier",
                    "ops",
                    q(f"sum by ({_TIER}) (rate({m.READ_TIER}[{RI}]))", f"{{{{{_TIER}}}}}"),
                    description="last_good and none are degraded answers (read availability).",
                ),
                panel(
                    "Dependency errors",
                    "ops",
                    q(
                        f"sum by (dependency) (rate({m.READ_DEPENDENCY_ERRORS}[{RI}]))",
                        "{{dependency}}",
                    ),
                ),
                panel(
                    "Breakers open",
                    "short",
                    q(f"max by (dependency) ({m.READ_BREAKER_OPEN})", "{{dependency}}"),
                ),
            ),
        ),
    ),
)

_LAG_GROUP = m.CONSUMER_LAG_GROUP_LABEL
_LAG_LEGEND = f"{{{{{_LAG_GROUP}}}}}"  # Grafana's {{group}}
STREAM = Board(
    "likes-stream",
    "Likes / Stream",
    "Kafka and the aggregator that folds committed likes into counts: lag, windows, failures.",
    (
        (
            "Consumers",
            (
                panel(
                    "Consumer lag (age of the oldest unconsumed event)",
                    "s",
                    q(f"max by ({_LAG_GROUP}) ({m.CONSUMER_LAG_SECONDS})", _LAG_LEGEND),
                ),
                panel(
                    "Consumer lag (messages)",
                    "short",
                    q(f"sum by ({_LAG_GROUP}) ({m.CONSUMER_LAG_MESSAGES})", _LAG_LEGEND),
                ),
            ),
        ),
        (
            "Aggregator",
            (
                panel(
                    "Events consumed and applied",
                    "ops",
                    q(f"sum(rate({m.AGGREGATOR_EVENTS_CONSUMED}[{RI}]))", "consumed"),
                    q(f"sum(rate({m.AGGREGATOR_EVENTS_APPLIED}[{RI}]))", "applied"),
                    q(f"sum(rate({m.AGGREGATOR_DEDUP_HITS}[{RI}]))", "duplicates"),
                ),
                panel(
                    "Windows flushed",
                    "ops",
                    q(f"sum(rate({m.AGGREGATOR_WINDOWS_FLUSHED}[{RI}]))", "windows"),
                ),
                panel(
                    "Flush p99",
                    "s",
                    q(
                        "histogram_quantile(0.99, sum by (le) "
                        f"(rate({m.AGGREGATOR_FLUSH_SECONDS}_bucket[{RI}])))",
                        "p99",
                    ),
                ),
                panel(
                    "Events per cell write",
                    "short",
                    q(f"avg({m.AGGREGATOR_COLLAPSE_FACTOR})", "collapse"),
                ),
                panel(
                    "Failures",
                    "ops",
                    q(f"sum(rate({m.AGGREGATOR_FLUSH_FAILURES}[{RI}]))", "flush"),
                    q(f"sum(rate({m.AGGREGATOR_COMMIT_FAILURES}[{RI}]))", "commit"),
                    q(f"sum(rate({m.AGGREGATOR_DEAD_LETTERS}[{RI}]))", "dead-lettered"),
                ),
                panel(
                    "CDN purges",
                    "ops",
                    q(f"sum(rate({m.CDN_PURGED}[{RI}]))", "keys purged"),
                    q(f"sum(rate({m.CDN_PURGE_FAILURES}[{RI}]))", "batches given up"),
                ),
            ),
        ),
        (
            "Kafka",
            (
                panel(
                    "Messages in by topic",
                    "ops",
                    q(
                        "sum by (topic) "
                        f'(rate(kafka_server_brokertopicmetrics_messagesin_total{{topic!=""}}[{RI}]))',
                        "{{topic}}",
                    ),
                ),
                stat(
                    "Under-replicated partitions",
                    "short",
                    q("sum(kafka_server_replicamanager_underreplicatedpartitions)"),
                ),
            ),
        ),
    ),
)

HOT_KEYS = Board(
    "likes-hotkeys",
    "Likes / Hot keys",
    "The sampler's flags and the count-cache shards a missed hot key would overload.",
    (
        (
            "Detection and decisions",
            (
                panel(
                    "Sampled reads",
                    "ops",
                    q(f"sum(rate({m.SAMPLER_SAMPLES}[{RI}]))", "samples"),
                ),
                panel(
                    "Posts flagged hot",
                    "short",
                    q(f"max({m.SAMPLER_PUBLISHED_POSTS})", "flagged"),
                    description="What the operator replicates or splits is in each "
                    "HotKeyPolicy's status (`likes hotkeys`).",
                ),
            ),
        ),
        (
            "Count-cache shards",
            (
                panel(
                    "Commands per primary",
                    "ops",
                    q(alert_rules.COUNT_CACHE_PRIMARY_OPS, "{{instance}}"),
                    description="The input of the shard skew below, as its rule computes it.",
                ),
                panel(
                    "Shard skew (busiest primary over the mean)",
                    "short",
                    q(alert_rules.REDIS_SHARD_QPS_SKEW, "skew"),
                ),
                panel(
                    "Replication lag",
                    "s",
                    q(alert_rules.REPLICATION_LAG_SECONDS, "{{instance}}"),
                ),
                panel(
                    "Memory used",
                    "bytes",
                    q(f"redis_memory_used_bytes{{{_COUNT_CACHE}}}", "{{instance}}"),
                ),
            ),
        ),
    ),
)

CONTROL_PLANE = Board(
    "likes-control-plane",
    "Likes / Control plane",
    "etcd, the scrape targets, the alerting and tracing pipelines and the canary's verdict.",
    (
        (
            "Health",
            (
                panel(
                    "Targets down by workload",
                    "short",
                    q(f"sum by ({alert_rules.WORKLOAD_LABEL}) (1 - up)", "{{workload}}"),
                ),
                panel(
                    "Alerts firing by severity",
                    "short",
                    q('count by (severity) (ALERTS{alertstate="firing"})', "{{severity}}"),
                    description="The Watchdog always fires: one `none` means the pipeline works.",
                ),
                panel(
                    "Canary",
                    "percentunit",
                    q(m.CANARY_DRIFT_RATIO, "drift ratio"),
                    q(m.COUNT_FLICKER_PER_USER, "flickers per user-hour"),
                ),
            ),
        ),
        (
            "etcd",
            (
                stat("Has a leader", "short", q("min(etcd_server_has_leader)")),
                panel(
                    "WAL fsync p99",
                    "s",
                    q(
                        "histogram_quantile(0.99, sum by (le) "
                        f"(rate(etcd_disk_wal_fsync_duration_seconds_bucket[{RI}])))",
                        "p99",
                    ),
                ),
                panel(
                    "Database size",
                    "bytes",
                    q("max(etcd_mvcc_db_total_size_in_bytes)", "db"),
                ),
            ),
        ),
        (
            "Prometheus and Alertmanager",
            (
                panel(
                    "Rule evaluation failures",
                    "ops",
                    q(f"sum(rate(prometheus_rule_evaluation_failures_total[{RI}]))", "failures"),
                ),
                panel(
                    "Notifications failed by integration",
                    "ops",
                    q(
                        "sum by (integration) "
                        f"(rate(alertmanager_notifications_failed_total[{RI}]))",
                        "{{integration}}",
                    ),
                ),
            ),
        ),
        (
            "Traces",
            (
                panel(
                    "Traces kept and spans dropped",
                    "ops",
                    q(m.TRACES_KEPT_PER_SECOND, "traces kept"),
                    q(m.OTLP_EXPORT_FAILURES, "spans failed to export"),
                    description="Tail sampling keeps errors, slow traces and a healthy share.",
                ),
            ),
        ),
    ),
)

ABUSE = Board(
    "likes-abuse",
    "Likes / Abuse",
    "The abuse scorer (consumes likes.committed, voids bots' likes, degrades storming accounts) "
    "and its model server (the sidecar it calls over gRPC).",
    (
        (
            "Scorer",
            (
                panel(
                    "Likes consumed and scored",
                    "ops",
                    q(f"sum(rate({m.ABUSE_EVENTS_CONSUMED}[{RI}]))", "consumed"),
                    q(f"sum(rate({m.ABUSE_SCORED}[{RI}]))", "scored"),
                    description="Scored stays under consumed while scoring is deferred.",
                ),
                panel(
                    "Voids by result",
                    "ops",
                    q(f"sum by (result) (rate({m.ABUSE_VOIDS}[{RI}]))", "{{result}}"),
                    description="`voided`: a like taken out of its count; `replayed`: a void "
                    "found already written (a retry, harmless).",
                ),
                panel(
                    "Bot probability p50 / p99",
                    "percentunit",
                    *_p50_p99(f"{m.ABUSE_SCORES}_bucket"),
                ),
                panel(
                    "Accounts degraded, scoring deferred",
                    "short",
                    q(
                        f"sum(increase({m.ABUSE_DEGRADED}[{alert_rules.ABUSE_STORM_WINDOW}]))",
                        f"degraded in {alert_rules.ABUSE_STORM_WINDOW}",
                    ),
                    q(f"max({m.ABUSE_DEFERRED})", "deferred (1: a batch waits)"),
                    description=f"AbuseStorm pages at {alert_rules.ABUSE_STORM_ACCOUNTS} "
                    f"accounts degraded in {alert_rules.ABUSE_STORM_WINDOW}.",
                ),
                panel(
                    "Dependency failures",
                    "ops",
                    q(
                        f"sum by (dependency) (rate({m.ABUSE_DEPENDENCY_FAILURES}[{RI}]))",
                        "{{dependency}}",
                    ),
                ),
            ),
        ),
        (
            "Model server",
            (
                panel(
                    "Score calls by answer",
                    "reqps",
                    q(f"sum by (code) (rate({m.ABUSE_MODEL_CALLS}[{RI}]))", "{{code}}"),
                ),
                panel(
                    "Rows scored",
                    "ops",
                    q(f"sum(rate({m.ABUSE_MODEL_ROWS}[{RI}]))", "rows"),
                ),
                panel(
                    "Score call latency p99",
                    "s",
                    q(
                        "histogram_quantile(0.99, sum by (le) "
                        f"(rate({m.ABUSE_MODEL_SECONDS}_bucket[{RI}])))",
                        "p99",
                    ),
                ),
                stat(
                    "Model version serving",
                    "short",
                    q(f"max by (version) ({m.ABUSE_MODEL_SERVING})", "{{version}}"),
                    description="One version per model server after a `likes abuse use`.",
                ),
            ),
        ),
    ),
)

BOARDS: tuple[Board, ...] = (EDGE, WRITE, READ, STREAM, HOT_KEYS, CONTROL_PLANE, ABUSE)


# --- building --------------------------------------------------------------------------------
WIDTH = 24
HEIGHT = 8


def _datasource() -> dm.DataSourceRef:
    return dm.DataSourceRef(type_val="prometheus", uid=DATASOURCE_UID)


def _panel(p: Panel, pid: int, x: int, y: int, width: int) -> gt.Panel | gs.Panel:
    builder = gs.Panel() if p.kind == "stat" else gt.Panel()
    builder = (
        builder.id(pid)
        .title(p.title)
        .unit(p.unit)
        .datasource(_datasource())
        .grid_pos(dm.GridPos(h=HEIGHT, w=width, x=x, y=y))
    )
    if p.description:
        builder = builder.description(p.description)
    for i, query in enumerate(p.queries):
        target = gp.Dataquery().expr(query.expr).ref_id(chr(ord("A") + i))
        if query.legend:
            target = target.legend_format(query.legend)
        builder = builder.with_target(target)
    return builder


def build(board: Board) -> dict[str, object]:
    """The dashboard's JSON model, as Grafana's file provider loads it."""
    d = (
        gd.Dashboard(board.title)
        .uid(board.uid)
        .description(board.description)
        .tags(["likes", "generated"])
        .readonly()  # provisioned from code: a change goes through this file
        .refresh("30s")
        .time("now-1h", "now")
    )
    pid, y = 1, 0
    for title, panels in board.rows:
        d = d.with_row(gd.Row(title).id(pid).grid_pos(dm.GridPos(h=1, w=WIDTH, x=0, y=y)))
        pid, y = pid + 1, y + 1
        per_line = 3 if len(panels) % 3 == 0 or len(panels) > 4 else 2
        width = WIDTH // per_line
        for i, p in enumerate(panels):
            col = i % per_line
            if i and col == 0:
                y += HEIGHT
            d = d.with_panel(_panel(p, pid, col * width, y, width))
            pid += 1
        y += HEIGHT
    out: dict[str, object] = json.loads(JSONEncoder(sort_keys=True).encode(d.build()))
    return out


def render(boards: Sequence[Board] = BOARDS) -> dict[str, str]:
    """The dashboards ConfigMap's data: `<uid>.json` -> the dashboard's JSON."""
    return {f"{b.uid}.json": json.dumps(build(b), indent=1, sort_keys=True) for b in boards}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m infra.dashboards DIR", file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    for name, text in render().items():
        (out / name).write_text(text + "\n")
        print(out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
