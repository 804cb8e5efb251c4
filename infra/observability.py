"""Observability: OpenTelemetry Collector in two tiers (a load-balancing tier that routes every
span of a trace to one sampler, and the tail-sampling tier with a disk buffer; its config comes
from infra/otel_config), Tempo, Prometheus remote-writing to Mimir with the generated alert rules,
Alertmanager (pages to PagerDuty, tickets to a webhook, the Watchdog to a dead man's switch), and
Grafana showing the dashboards of infra/dashboards.py, read-only."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import yaml

from infra import alert_rules, dashboards, exporters, otel_config
from infra import k8s as kx
from services.contracts import workloads

OTLP_GRPC = 4317
OTLP_HTTP = 4318
BUFFER_DIR = "/var/lib/otelcol/buffer"
COLLECTOR_CONFIG_DIR = "/etc/otelcol"
COLLECTOR_CONFIG_FILE = "config.yaml"  # in each tier's ConfigMap, at COLLECTOR_CONFIG_DIR
COLLECTOR_ARGS = [f"--config={COLLECTOR_CONFIG_DIR}/{COLLECTOR_CONFIG_FILE}"]
PAGERDUTY_SECRET = "alertmanager-pagerduty"
COLLECTOR_IMAGE = f"otel/opentelemetry-collector-contrib:{otel_config.COLLECTOR_VERSION}"

# The versions the local stack runs (Debian bookworm's prometheus and prometheus-alertmanager):
# production pins the same ones, so the rendered configs are checked by the binaries that will
# load them. tests/infra/test_observability.py fails when the local binaries disagree.
PROMETHEUS_VERSION = "2.42.0"
ALERTMANAGER_VERSION = "0.25.0"
PROMETHEUS_IMAGE = f"prom/prometheus:v{PROMETHEUS_VERSION}"
ALERTMANAGER_IMAGE = f"prom/alertmanager:v{ALERTMANAGER_VERSION}"
PROMETHEUS_PORT = 9090
ALERTMANAGER_PORT = 9093
ALERTMANAGER_CLUSTER_PORT = 9094  # the replicas' gossip (memberlist: TCP and UDP)
ALERTMANAGER_REPLICAS = 3
# Grafana: the dashboards as code, provisioned read-only; nobody logs in (anonymous viewers, no
# login form), so no admin password exists to leak, and a change goes through infra/dashboards.py.
# Reached with `kubectl port-forward svc/grafana 3000` (a port-forward is not network traffic).
GRAFANA_IMAGE = "grafana/grafana:10.4.2"  # the 10.x schema grafana-foundation-sdk generates
GRAFANA_PORT = 3000
GRAFANA_UID = 472  # the image's grafana user
GRAFANA_PROVISIONING = "/etc/grafana/provisioning"
GRAFANA_DATA = "/var/lib/grafana"
GRAFANA_ENV = {
    # the root filesystem is read-only: data, plugins and logs live in the one writable volume
    "GF_PATHS_DATA": GRAFANA_DATA,
    "GF_PATHS_PLUGINS": f"{GRAFANA_DATA}/plugins",
    "GF_PATHS_LOGS": f"{GRAFANA_DATA}/log",
    "GF_LOG_MODE": "console",
    "GF_PATHS_PROVISIONING": GRAFANA_PROVISIONING,
    "GF_AUTH_ANONYMOUS_ENABLED": "true",
    "GF_AUTH_ANONYMOUS_ORG_ROLE": "Viewer",
    "GF_AUTH_DISABLE_LOGIN_FORM": "true",
    "GF_AUTH_BASIC_ENABLED": "false",
    "GF_USERS_ALLOW_SIGN_UP": "false",
    # no egress to grafana.com: nothing to report to or update from
    "GF_ANALYTICS_REPORTING_ENABLED": "false",
    "GF_ANALYTICS_CHECK_FOR_UPDATES": "false",
    "GF_ANALYTICS_CHECK_FOR_PLUGIN_UPDATES": "false",
}

# Alertmanager's default (global.pagerduty_url), named in the rendered receiver so that what
# the NetworkPolicy opens is read from the config
PAGERDUTY_URL = "https://events.pagerduty.com/v2/enqueue"


def config_map_name(app: str) -> str:
    """The ConfigMap holding an app's config files."""
    return f"{app}-config"


# Where the rendered configs live (the local stack reads them back from the plan).
PROMETHEUS_CONFIG_MAP = config_map_name("prometheus")
PROMETHEUS_CONFIG_FILE = "prometheus.yml"
RULES_CONFIG_MAP = "prometheus-rules"
ALERTMANAGER_CONFIG_MAP = config_map_name("alertmanager")
ALERTMANAGER_CONFIG_FILE = "alertmanager.yml"

# Alertmanager receivers. Alertmanager 0.25 has no `url_file` for webhooks, so the ticket and
# heartbeat URLs sit in the ConfigMap in plain text: use URLs that carry no credential beyond
# "may post here" (0.26+ could read them from the Secret like the PagerDuty key).
PAGER_RECEIVER = "pagerduty"
TICKET_RECEIVER = "tickets"
# The abuse team's pages (alerts labelled team=abuse, severity=page): their own PagerDuty service
# when the stack has its key, else the platform's pager, else the tickets.
ABUSE_RECEIVER = "abuse-team"
PAGERDUTY_DIR = "/etc/alertmanager/pagerduty"  # the Secret's keys, mounted as files
PAGERDUTY_KEY = "routing-key"
ABUSE_PAGERDUTY_KEY = "abuse-routing-key"
HEARTBEAT_RECEIVER = "heartbeat"
# The dead man's switch expects a post at least every HEARTBEAT_REPEAT (the seed: every 5 min);
# give it a grace of a few periods before it pages.
HEARTBEAT_REPEAT = "5m"


# Pods opt in to scraping with these annotations (infra/services.py sets them); the relabeling
# reads them, and the pod's name label, as Kubernetes SD's meta labels (sd_label).
SCRAPE_ANNOTATION = "prometheus.io/scrape"
PORT_ANNOTATION = "prometheus.io/port"
PATH_ANNOTATION = "prometheus.io/path"
NAME_LABEL = "app.kubernetes.io/name"
# annotations whose value is a port of the pod: the local stack replaces them with its own ports
PORT_ANNOTATIONS = (PORT_ANNOTATION, exporters.REDIS_PORT_ANNOTATION)
SIDECAR_JOB = "pod-sidecars"  # sidecars' ops ports, by name (workloads.SIDECAR_METRICS_PORT)


def scrape_annotations(port: int, path: str = "/metrics") -> dict[str, str]:
    """What opts a pod into the `pods` job: scraped at `port` and `path`."""
    return {SCRAPE_ANNOTATION: "true", PORT_ANNOTATION: str(port), PATH_ANNOTATION: path}


def sd_label(kind: str, name: str) -> str:
    """The meta label Kubernetes SD (role: pod) gives a pod's `label` or `annotation` `name`."""
    return f"__meta_kubernetes_pod_{kind}_" + re.sub(r"[^a-zA-Z0-9_]", "_", name)


def in_cluster(app: str, namespace: str, port: int) -> str:
    """host:port of a Service inside the cluster."""
    return f"{app}.{namespace}.svc.cluster.local:{port}"


@dataclass(frozen=True)
class AlertReceivers:
    """Where alerts leave the cluster, besides PagerDuty: every ticket (and every page when the
    stack has no PagerDuty key) goes to `ticket_webhook_url`; the Watchdog goes to
    `heartbeat_url`. Without a heartbeat URL (allowed outside prod only) the heartbeat receiver
    has no integration: the stack has no dead man's switch, and the policy says so in prod."""

    ticket_webhook_url: str
    heartbeat_url: str | None = None


@dataclass(frozen=True)
class ObservabilityArgs:
    namespace: str
    cluster_name: str
    region: str
    mimir_remote_write_url: str
    prometheus_retention: str
    prometheus_storage_gi: int
    tempo_storage_gi: int
    collector_replicas: int
    latency_threshold_ms: int
    healthy_percent: float
    pagerduty_routing_key: pulumi.Input[str] | None
    scrape_namespaces: Sequence[str]
    receivers: AlertReceivers
    storage_class: str = "gp3"
    # host:port of the multi-target redis_exporter (infra/redis.py); None: Redis is not scraped
    redis_exporter: str | None = None
    abuse_pagerduty_routing_key: pulumi.Input[str] | None = None  # the abuse team's service


def loadbalancer_config(sampler_service: str) -> dict[str, Any]:
    """The first tier: spans in, routed by trace id to one sampler pod (tail sampling needs
    every span of a trace in the same collector)."""
    return {
        "receivers": {
            "otlp": {
                "protocols": {
                    "grpc": {"endpoint": f"0.0.0.0:{OTLP_GRPC}"},
                    "http": {"endpoint": f"0.0.0.0:{OTLP_HTTP}"},
                }
            }
        },
        "exporters": {
            "loadbalancing": {
                "routing_key": "traceID",
                "protocol": {"otlp": {"tls": {"insecure": True}}},
                "resolver": {"k8s": {"service": sampler_service, "ports": [OTLP_GRPC]}},
            }
        },
        "extensions": {"health_check": {"endpoint": f"0.0.0.0:{otel_config.HEALTH_PORT}"}},
        "service": {
            "extensions": ["health_check"],
            "pipelines": {"traces": {"receivers": ["otlp"], "exporters": ["loadbalancing"]}},
            "telemetry": otel_config.telemetry(),
        },
    }


def prometheus_config(args: ObservabilityArgs, alertmanager: str) -> dict[str, Any]:
    """Scrapes every annotated pod of `scrape_namespaces`. The target labels it attaches
    (namespace, pod, workload) never include a label our code emits: honor_labels stays false,
    so a clash would rename the code's label to exported_<name> and the rules would miss it."""
    pod_sd = [
        {"role": "pod", "namespaces": {"names": list(args.scrape_namespaces)}},
    ]
    return {
        "global": {
            "scrape_interval": "15s",
            "evaluation_interval": "15s",
            "external_labels": {"cluster": args.cluster_name, "region": args.region},
        },
        "rule_files": ["/etc/prometheus/rules/*.yml"],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]},
        "scrape_configs": [
            {
                # Pods opt in with prometheus.io/scrape: "true" (and /port, /path).
                "job_name": "pods",
                "kubernetes_sd_configs": pod_sd,
                "relabel_configs": [
                    {
                        "source_labels": [sd_label("annotation", SCRAPE_ANNOTATION)],
                        "regex": "true",
                        "action": "keep",
                    },
                    {
                        "source_labels": [sd_label("annotation", PATH_ANNOTATION)],
                        "regex": "(.+)",
                        "target_label": "__metrics_path__",
                    },
                    {
                        "source_labels": ["__address__", sd_label("annotation", PORT_ANNOTATION)],
                        "regex": "([^:]+)(?::\\d+)?;(\\d+)",
                        "replacement": "$1:$2",
                        "target_label": "__address__",
                    },
                    *_target_labels(),
                ],
            },
            {
                # Sidecars: a pod's annotations name one port (its workload's), so a sidecar's
                # metrics are found by its container port's name; `workload` is the container's.
                "job_name": SIDECAR_JOB,
                "kubernetes_sd_configs": pod_sd,
                "relabel_configs": [
                    {
                        "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                        "regex": workloads.SIDECAR_METRICS_PORT,
                        "action": "keep",
                    },
                    {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
                    {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
                    {
                        "source_labels": ["__meta_kubernetes_pod_container_name"],
                        "target_label": alert_rules.WORKLOAD_LABEL,
                    },
                ],
            },
            *_redis_jobs(args),
        ],
        "remote_write": [
            {
                "url": args.mimir_remote_write_url,
                "queue_config": {"max_samples_per_send": 2000, "capacity": 10000},
            }
        ],
    }


def _target_labels() -> list[dict[str, Any]]:
    """The labels every target gets from its pod: namespace, pod, workload."""
    return [
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {
            "source_labels": [sd_label("label", NAME_LABEL)],
            "target_label": alert_rules.WORKLOAD_LABEL,
        },
    ]


def _redis_jobs(args: ObservabilityArgs) -> list[dict[str, Any]]:
    """Every annotated Redis pod, scraped through the one multi-target exporter
    (infra/exporters.py): the target is the Redis address, the scrape goes to the exporter, and
    `instance` names the Redis, not the exporter."""
    if args.redis_exporter is None:
        return []
    return [
        {
            "job_name": exporters.REDIS_JOB,
            "metrics_path": exporters.REDIS_SCRAPE_PATH,
            "kubernetes_sd_configs": [
                {"role": "pod", "namespaces": {"names": list(args.scrape_namespaces)}}
            ],
            "relabel_configs": [
                {
                    "source_labels": [sd_label("annotation", exporters.REDIS_SCRAPE_ANNOTATION)],
                    "regex": "true",
                    "action": "keep",
                },
                {
                    "source_labels": [
                        "__address__",
                        sd_label("annotation", exporters.REDIS_PORT_ANNOTATION),
                    ],
                    "regex": "([^:]+)(?::\\d+)?;(\\d+)",
                    "replacement": "redis://$1:$2",
                    "target_label": "__param_target",
                },
                {"source_labels": ["__param_target"], "target_label": "instance"},
                {"target_label": "__address__", "replacement": args.redis_exporter},
                *_target_labels(),
            ],
        }
    ]


def _pagerduty(key_file: str) -> dict[str, Any]:
    # read from the mounted Secret: the key never sits in this ConfigMap
    return {"pagerduty_configs": [{"routing_key_file": f"{PAGERDUTY_DIR}/{key_file}",
                                   "url": PAGERDUTY_URL}]}  # fmt: skip


def alertmanager_config(
    has_pager: bool, receivers: AlertReceivers, has_abuse_pager: bool = False
) -> dict[str, Any]:
    """Three ways out and no silent one: the Watchdog to the heartbeat, pages to PagerDuty (to the
    ticket webhook when the stack has no PagerDuty key), everything else to the ticket webhook.
    The abuse team's pages go to their own PagerDuty service (ABUSE_RECEIVER), falling back to
    the platform's pager, then the tickets."""
    heartbeat: dict[str, Any] = {"name": HEARTBEAT_RECEIVER}
    if receivers.heartbeat_url is not None:
        # a resolved Watchdog means Prometheus stopped: not a heartbeat, never send it
        heartbeat["webhook_configs"] = [{"url": receivers.heartbeat_url, "send_resolved": False}]
    routes: list[dict[str, Any]] = [
        {
            "receiver": HEARTBEAT_RECEIVER,
            "matchers": [f'alertname="{alert_rules.WATCHDOG}"'],
            # a steady beat: first post at once, then every HEARTBEAT_REPEAT
            "group_wait": "0s",
            "group_interval": "1m",
            "repeat_interval": HEARTBEAT_REPEAT,
        }
    ]
    tickets = {"webhook_configs": [{"url": receivers.ticket_webhook_url}]}
    out: list[dict[str, Any]] = [heartbeat, {"name": TICKET_RECEIVER, **tickets}]
    abuse = (
        _pagerduty(ABUSE_PAGERDUTY_KEY) if has_abuse_pager
        else _pagerduty(PAGERDUTY_KEY) if has_pager
        else tickets
    )  # fmt: skip
    out.append({"name": ABUSE_RECEIVER, **abuse})
    routes.append(
        {
            "receiver": ABUSE_RECEIVER,
            "matchers": [
                f'{alert_rules.TEAM_LABEL}="{alert_rules.ABUSE_TEAM}"',
                f'severity="{alert_rules.SEVERITY_PAGE}"',
            ],
        }
    )
    if has_pager:
        out.append({"name": PAGER_RECEIVER, **_pagerduty(PAGERDUTY_KEY)})
        routes.append(
            {
                "receiver": PAGER_RECEIVER,
                "matchers": [f'severity="{alert_rules.SEVERITY_PAGE}"'],
            }
        )
    routes.append(
        {"receiver": TICKET_RECEIVER, "matchers": [f'severity="{alert_rules.SEVERITY_TICKET}"']}
    )
    route: dict[str, Any] = {
        # the catch-all: an alert with an unexpected severity still reaches a person
        "receiver": TICKET_RECEIVER,
        "group_by": ["alertname", "slo"],
        "group_wait": "30s",
        "group_interval": "5m",
        "repeat_interval": "4h",
        "routes": routes,
    }
    inhibit = [
        {
            "source_matchers": [
                f'alertname="{i.source}"',
                f'severity="{alert_rules.SEVERITY_PAGE}"',
            ],
            "target_matchers": [f'alertname="{i.target}"'],
            # one region's store down says nothing of another region's relays
            "equal": ["region"],
        }
        for i in alert_rules.INHIBITIONS
    ]
    return {"route": route, "receivers": out, "inhibit_rules": inhibit}


def grafana_provisioning(prometheus_url: str) -> dict[str, str]:
    """Grafana's provisioning files (key -> path under GRAFANA_PROVISIONING): the Prometheus
    datasource the dashboards name by uid, and the file provider that loads them read-only."""
    datasources = {
        "apiVersion": 1,
        "datasources": [
            {
                "name": "Prometheus",
                "uid": dashboards.DATASOURCE_UID,
                "type": "prometheus",
                "access": "proxy",
                "url": prometheus_url,
                "isDefault": True,
                "editable": False,
            }
        ],
    }
    providers = {
        "apiVersion": 1,
        "providers": [
            {
                "name": "likes",
                "type": "file",
                "disableDeletion": True,
                "allowUiUpdates": False,
                "updateIntervalSeconds": 60,
                "options": {"path": dashboards.MOUNT_PATH},
            }
        ],
    }
    return {
        "datasources/prometheus.yaml": yaml.safe_dump(datasources, sort_keys=False),
        "dashboards/likes.yaml": yaml.safe_dump(providers, sort_keys=False),
    }


def dials(
    ns: str,
    front: Mapping[str, Any],
    sampler: Mapping[str, Any],
    prometheus: Mapping[str, Any],
    alerting: Mapping[str, Any],
    alertmanager_peers: Sequence[str],
    grafana: Mapping[str, str],
) -> list[kx.Dial]:
    """The connections the rendered configs make (infra/netpol.py opens exactly these; the
    workloads' own, to the collector, follow their env): read from the configs, so a new
    receiver or exporter is opened with it. Prometheus's scrapes follow the pods it discovers."""
    resolver = front["exporters"]["loadbalancing"]["resolver"]["k8s"]
    out = [
        kx.Dial(ns, otel_config.COLLECTOR, f"{resolver['service']}.svc:{port}", "to the samplers")
        for port in resolver["ports"]
    ]
    out.append(kx.Dial(ns, otel_config.COLLECTOR, kx.KUBE_API, "the k8s resolver's endpoints"))
    tempo = sampler["exporters"][otel_config.TEMPO_EXPORTER]["endpoint"]
    out.append(kx.Dial(ns, otel_config.SAMPLER, tempo, "the sampled traces"))
    for am in prometheus["alerting"]["alertmanagers"]:
        for static in am["static_configs"]:
            out += [kx.Dial(ns, "prometheus", t, "alerts") for t in static["targets"]]
    out += [kx.Dial(ns, "prometheus", w["url"], "remote write") for w in prometheus["remote_write"]]
    if any("kubernetes_sd_configs" in job for job in prometheus["scrape_configs"]):
        out.append(kx.Dial(ns, "prometheus", kx.KUBE_API, "Kubernetes service discovery"))
    for receiver in alerting["receivers"]:
        for kind, integrations in receiver.items():
            if kind.endswith("_configs"):
                # every integration names its URL (a kind without one fails here)
                why = f"the {receiver['name']} receiver"
                out += [kx.Dial(ns, "alertmanager", i["url"], why) for i in integrations]
    out += [
        kx.Dial(ns, "alertmanager", peer, "gossip", ("TCP", "UDP")) for peer in alertmanager_peers
    ]
    for source in yaml.safe_load(grafana["datasources/prometheus.yaml"])["datasources"]:
        out.append(kx.Dial(ns, "grafana", source["url"], "the dashboards' queries"))
    return out


class Observability(pulumi.ComponentResource):
    otlp_endpoint: str
    otlp_grpc_address: str
    prometheus_url: str
    dials: list[kx.Dial]

    def __init__(
        self, name: str, args: ObservabilityArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("likes:infra:Observability", name, None, opts)
        self._args = args
        ns = args.namespace
        svc = f"{ns}.svc.cluster.local"
        tempo_endpoint = f"tempo.{svc}:{OTLP_GRPC}"
        sampler = otel_config.collector_config(
            tempo_endpoint=tempo_endpoint,
            error_sampling=True,
            latency_threshold_ms=args.latency_threshold_ms,
            healthy_percent=args.healthy_percent,
            buffer_dir=BUFFER_DIR,
        )
        self._stateful(
            otel_config.SAMPLER,
            image=COLLECTOR_IMAGE,
            args_=COLLECTOR_ARGS,
            files={COLLECTOR_CONFIG_FILE: yaml.safe_dump(sampler, sort_keys=False)},
            config_path=COLLECTOR_CONFIG_DIR,
            ports={"otlp-grpc": OTLP_GRPC},
            probe=kx.tcp_probe(OTLP_GRPC),
            replicas=args.collector_replicas,
            storage=("buffer", BUFFER_DIR, 20),
            resources=kx.resources("1", "2Gi", cpu_limit="2"),
            uid=10001,
            scrape_port=otel_config.METRICS_PORT,  # traces kept, export failures
        )
        front = loadbalancer_config(f"{otel_config.SAMPLER}.{ns}")
        self._deployment(
            otel_config.COLLECTOR,
            image=COLLECTOR_IMAGE,
            args_=COLLECTOR_ARGS,
            files={COLLECTOR_CONFIG_FILE: yaml.safe_dump(front, sort_keys=False)},
            ports={"otlp-grpc": OTLP_GRPC, "otlp-http": OTLP_HTTP},
            replicas=args.collector_replicas,
            service_account_rbac=True,  # the k8s resolver watches the sampler's endpoints
            scrape_port=otel_config.METRICS_PORT,  # spans refused or not routed
        )
        self._stateful(
            "tempo",
            image="grafana/tempo:2.9.0",
            args_=["-config.file=/etc/tempo/tempo.yaml"],
            files={"tempo.yaml": yaml.safe_dump(_tempo_config(), sort_keys=False)},
            config_path="/etc/tempo",
            ports={"otlp-grpc": OTLP_GRPC, "http": 3200},
            probe=kx.http_probe("/ready", 3200, delay=15),
            replicas=1,
            storage=("data", "/var/tempo", args.tempo_storage_gi),
            resources=kx.resources("1", "4Gi", cpu_limit="2"),
            uid=10001,
        )
        rules = alert_rules.render(alert_rules.rule_groups(alert_rules.default_slos()))
        k8s.core.v1.ConfigMap(
            RULES_CONFIG_MAP,
            metadata=kx.meta(
                RULES_CONFIG_MAP, ns, kx.labels("prometheus", "rules", "observability")
            ),
            data={alert_rules.RULES_FILENAME: rules},
            opts=pulumi.ResourceOptions(parent=self),
        )
        alertmanager_address = in_cluster("alertmanager", ns, ALERTMANAGER_PORT)
        prometheus = prometheus_config(args, alertmanager_address)
        self._stateful(
            "prometheus",
            image=PROMETHEUS_IMAGE,
            args_=[
                "--config.file=/etc/prometheus/prometheus.yml",
                "--storage.tsdb.path=/prometheus",
                f"--storage.tsdb.retention.time={args.prometheus_retention}",
                "--web.enable-lifecycle",
            ],
            files={PROMETHEUS_CONFIG_FILE: yaml.safe_dump(prometheus, sort_keys=False)},
            config_path="/etc/prometheus",
            ports={"http": PROMETHEUS_PORT},
            probe=kx.http_probe("/-/ready", PROMETHEUS_PORT, delay=10),
            liveness=kx.http_probe("/-/healthy", PROMETHEUS_PORT, delay=30),
            replicas=2,
            storage=("data", "/prometheus", args.prometheus_storage_gi),
            resources=kx.resources("2", "8Gi", cpu_limit="4"),
            uid=65534,
            extra_mounts=[("rules", RULES_CONFIG_MAP, "/etc/prometheus/rules")],
            service_account_rbac=True,
            scrape_port=PROMETHEUS_PORT,  # its own TSDB, rule evaluation and scrape health
        )
        keys = {
            name: key
            for name, key in (
                (PAGERDUTY_KEY, args.pagerduty_routing_key),
                (ABUSE_PAGERDUTY_KEY, args.abuse_pagerduty_routing_key),
            )
            if key is not None
        }
        extra: list[tuple[str, str, str]] = []
        if keys:
            k8s.core.v1.Secret(
                PAGERDUTY_SECRET,
                metadata=kx.meta(
                    PAGERDUTY_SECRET, ns, kx.labels("alertmanager", "paging", "observability")
                ),
                string_data=keys,
                opts=pulumi.ResourceOptions(parent=self),
            )
            extra.append(("pagerduty", f"secret:{PAGERDUTY_SECRET}", PAGERDUTY_DIR))
        alerting = alertmanager_config(
            PAGERDUTY_KEY in keys, args.receivers, ABUSE_PAGERDUTY_KEY in keys
        )
        peers = [
            f"alertmanager-{i}.alertmanager.{svc}:{ALERTMANAGER_CLUSTER_PORT}"
            for i in range(ALERTMANAGER_REPLICAS)
        ]
        self._stateful(
            "alertmanager",
            image=ALERTMANAGER_IMAGE,
            args_=[
                "--config.file=/etc/alertmanager/alertmanager.yml",
                "--storage.path=/alertmanager",
                f"--cluster.listen-address=0.0.0.0:{ALERTMANAGER_CLUSTER_PORT}",
                *[f"--cluster.peer={peer}" for peer in peers],
            ],
            files={ALERTMANAGER_CONFIG_FILE: yaml.safe_dump(alerting, sort_keys=False)},
            config_path="/etc/alertmanager",
            ports={"http": ALERTMANAGER_PORT, "cluster": ALERTMANAGER_CLUSTER_PORT},
            probe=kx.http_probe("/-/ready", ALERTMANAGER_PORT),
            liveness=kx.http_probe("/-/healthy", ALERTMANAGER_PORT, delay=10),
            replicas=ALERTMANAGER_REPLICAS,
            storage=("data", "/alertmanager", 2),
            resources=kx.resources("100m", "256Mi", cpu_limit="500m"),
            uid=65534,
            extra_mounts=extra,
            scrape_port=ALERTMANAGER_PORT,  # notifications sent and failed, per integration
        )
        # the services export with the OTLP/HTTP SDK: the full traces URL of the HTTP receiver
        self.otlp_endpoint = (
            f"http://{otel_config.COLLECTOR}.{svc}:{OTLP_HTTP}{otel_config.OTLP_TRACES_PATH}"
        )
        self.otlp_grpc_address = f"{otel_config.COLLECTOR}.{svc}:{OTLP_GRPC}"  # the gateway's
        self.prometheus_url = f"http://{in_cluster('prometheus', ns, PROMETHEUS_PORT)}"
        grafana = grafana_provisioning(self.prometheus_url)
        self._grafana(grafana)
        self.dials = dials(ns, front, sampler, prometheus, alerting, peers, grafana)
        self.register_outputs(
            {"otlp_endpoint": self.otlp_endpoint, "prometheus_url": self.prometheus_url}
        )

    def _grafana(self, provisioning: dict[str, str]) -> None:
        """Grafana: stateless (its database holds nothing the provisioning does not recreate),
        two replicas behind one Service; the dashboards come from their own ConfigMap."""
        app, ns = "grafana", self._args.namespace
        child = pulumi.ResourceOptions(parent=self)
        lbls = kx.labels(app, "dashboards", "observability")
        match = kx.selector(app)
        # a ConfigMap key has no "/": each file is stored flat and mounted at its path
        keys = {path: path.replace("/", "--") for path in provisioning}
        files = {keys[path]: text for path, text in provisioning.items()}
        self._config(app, lbls, files)
        k8s.core.v1.ConfigMap(
            dashboards.CONFIG_MAP,
            metadata=kx.meta(dashboards.CONFIG_MAP, ns, lbls),
            data=dashboards.render(),
            opts=child,
        )
        kx.service_account(app, ns, lbls, child)
        kx.headless_service(app, ns, lbls, match, {"http": GRAFANA_PORT}, child, headless=False)
        provisioning_volume = kx.core.VolumeArgs(
            name="provisioning",
            config_map=kx.core.ConfigMapVolumeSourceArgs(
                name=config_map_name(app),
                items=[kx.core.KeyToPathArgs(key=k, path=p) for p, k in keys.items()],
            ),
        )
        probe = kx.http_probe("/api/health", GRAFANA_PORT)
        k8s.apps.v1.Deployment(
            app,
            metadata=kx.meta(app, ns, lbls),
            spec=k8s.apps.v1.DeploymentSpecArgs(
                replicas=2,
                selector=kx.meta_v1.LabelSelectorArgs(match_labels=match),
                template=kx.core.PodTemplateSpecArgs(
                    metadata=kx.meta_v1.ObjectMetaArgs(labels=lbls),
                    spec=kx.core.PodSpecArgs(
                        service_account_name=app,
                        automount_service_account_token=False,
                        security_context=kx.pod_security(uid=GRAFANA_UID),
                        node_selector=kx.node_selector("system"),
                        topology_spread_constraints=kx.zone_spread(match),
                        containers=[
                            kx.core.ContainerArgs(
                                name=app,
                                image=GRAFANA_IMAGE,
                                env=[
                                    kx.core.EnvVarArgs(name=k, value=v)
                                    for k, v in GRAFANA_ENV.items()
                                ],
                                ports=[
                                    kx.core.ContainerPortArgs(
                                        name="http", container_port=GRAFANA_PORT
                                    )
                                ],
                                resources=kx.resources("100m", "256Mi", cpu_limit="1"),
                                liveness_probe=probe,
                                readiness_probe=probe,
                                security_context=kx.security(uid=GRAFANA_UID),
                                volume_mounts=[
                                    kx.mount("provisioning", GRAFANA_PROVISIONING, read_only=True),
                                    kx.mount("data", GRAFANA_DATA),
                                    kx.mount("tmp", "/tmp"),
                                    kx.mount("dashboards", dashboards.MOUNT_PATH, read_only=True),
                                ],
                            )
                        ],
                        volumes=[
                            provisioning_volume,
                            kx.empty_dir("data"),
                            kx.empty_dir("tmp", "64Mi"),
                            kx.config_volume("dashboards", dashboards.CONFIG_MAP),
                        ],
                    ),
                ),
            ),
            opts=child,
        )
        kx.pdb(app, ns, match, lbls, child, max_unavailable=1)

    def _rbac(
        self, app: str, lbls: dict[str, str], rules: list[k8s.rbac.v1.PolicyRuleArgs]
    ) -> None:
        ns = self._args.namespace
        child = pulumi.ResourceOptions(parent=self)
        k8s.core.v1.ServiceAccount(app, metadata=kx.meta(app, ns, lbls), opts=child)
        role_name = f"likes-{app}"
        k8s.rbac.v1.ClusterRole(
            role_name, metadata=kx.meta(role_name, None, lbls), rules=rules, opts=child
        )
        k8s.rbac.v1.ClusterRoleBinding(
            role_name,
            metadata=kx.meta(role_name, None, lbls),
            role_ref=k8s.rbac.v1.RoleRefArgs(
                api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=role_name
            ),
            subjects=[k8s.rbac.v1.SubjectArgs(kind="ServiceAccount", name=app, namespace=ns)],
            opts=child,
        )

    def _config(self, app: str, lbls: dict[str, str], files: dict[str, str]) -> None:
        k8s.core.v1.ConfigMap(
            config_map_name(app),
            metadata=kx.meta(config_map_name(app), self._args.namespace, lbls),
            data=files,
            opts=pulumi.ResourceOptions(parent=self),
        )

    def _volumes(
        self, extra_mounts: Sequence[tuple[str, str, str]]
    ) -> tuple[list[kx.core.VolumeArgs], list[kx.core.VolumeMountArgs]]:
        volumes, mounts = [], []
        for vname, source, path in extra_mounts:
            if source.startswith("secret:"):
                volumes.append(
                    kx.core.VolumeArgs(
                        name=vname,
                        secret=kx.core.SecretVolumeSourceArgs(
                            secret_name=source.removeprefix("secret:")
                        ),
                    )
                )
            else:
                volumes.append(kx.config_volume(vname, source))
            mounts.append(kx.mount(vname, path, read_only=True))
        return volumes, mounts

    def _stateful(
        self,
        app: str,
        *,
        image: str,
        args_: list[str],
        files: dict[str, str],
        config_path: str,
        ports: dict[str, int],
        probe: kx.core.ProbeArgs,
        replicas: int,
        storage: tuple[str, str, int],
        resources: kx.core.ResourceRequirementsArgs,
        uid: int,
        liveness: kx.core.ProbeArgs | None = None,
        extra_mounts: Sequence[tuple[str, str, str]] = (),
        service_account_rbac: bool = False,
        scrape_port: int | None = None,
    ) -> None:
        ns = self._args.namespace
        child = pulumi.ResourceOptions(parent=self)
        lbls = kx.labels(app, app, "observability")
        match = kx.selector(app)
        self._config(app, lbls, files)
        if service_account_rbac:
            self._rbac(app, lbls, _discovery_rules())
        else:
            kx.service_account(app, ns, lbls, child)
        kx.headless_service(app, ns, lbls, match, ports, child)
        volumes, mounts = self._volumes(extra_mounts)
        volumes.append(kx.config_volume("config", config_map_name(app)))
        vol_name, vol_path, size = storage
        annotations = None if scrape_port is None else scrape_annotations(scrape_port)
        container = kx.core.ContainerArgs(
            name=app,
            image=image,
            args=args_,
            ports=[kx.core.ContainerPortArgs(name=n, container_port=p) for n, p in ports.items()],
            resources=resources,
            liveness_probe=liveness or probe,
            readiness_probe=probe,
            security_context=kx.security(uid=uid),
            volume_mounts=[
                kx.mount("config", config_path, read_only=True),
                kx.mount(vol_name, vol_path),
                *mounts,
            ],
        )
        sts = k8s.apps.v1.StatefulSet(
            app,
            metadata=kx.meta(app, ns, lbls),
            spec=k8s.apps.v1.StatefulSetSpecArgs(
                replicas=replicas,
                service_name=app,
                pod_management_policy="Parallel",
                selector=kx.meta_v1.LabelSelectorArgs(match_labels=match),
                template=kx.core.PodTemplateSpecArgs(
                    metadata=kx.meta_v1.ObjectMetaArgs(labels=lbls, annotations=annotations),
                    spec=kx.core.PodSpecArgs(
                        service_account_name=app,
                        automount_service_account_token=service_account_rbac,
                        security_context=kx.pod_security(uid=uid),
                        node_selector=kx.node_selector("system"),
                        topology_spread_constraints=kx.zone_spread(match),
                        containers=[container],
                        volumes=volumes,
                    ),
                ),
                volume_claim_templates=[kx.pvc_template(vol_name, size, self._args.storage_class)],
            ),
            opts=child,
        )
        kx.pdb(
            app,
            ns,
            match,
            lbls,
            pulumi.ResourceOptions(parent=self, depends_on=[sts]),
            max_unavailable=1,
        )

    def _deployment(
        self,
        app: str,
        *,
        image: str,
        args_: list[str],
        files: dict[str, str],
        ports: dict[str, int],
        replicas: int,
        service_account_rbac: bool,
        scrape_port: int | None = None,
    ) -> None:
        ns = self._args.namespace
        child = pulumi.ResourceOptions(parent=self)
        lbls = kx.labels(app, app, "observability")
        match = kx.selector(app)
        self._config(app, lbls, files)
        if service_account_rbac:
            self._rbac(app, lbls, _discovery_rules())
        kx.headless_service(app, ns, lbls, match, ports, child, headless=False)
        annotations = None if scrape_port is None else scrape_annotations(scrape_port)
        k8s.apps.v1.Deployment(
            app,
            metadata=kx.meta(app, ns, lbls),
            spec=k8s.apps.v1.DeploymentSpecArgs(
                replicas=replicas,
                selector=kx.meta_v1.LabelSelectorArgs(match_labels=match),
                template=kx.core.PodTemplateSpecArgs(
                    metadata=kx.meta_v1.ObjectMetaArgs(labels=lbls, annotations=annotations),
                    spec=kx.core.PodSpecArgs(
                        service_account_name=app,
                        security_context=kx.pod_security(uid=10001),
                        node_selector=kx.node_selector("system"),
                        topology_spread_constraints=kx.zone_spread(match),
                        containers=[
                            kx.core.ContainerArgs(
                                name=app,
                                image=image,
                                args=args_,
                                ports=[
                                    kx.core.ContainerPortArgs(name=n, container_port=p)
                                    for n, p in ports.items()
                                ],
                                resources=kx.resources("500m", "1Gi", cpu_limit="2"),
                                liveness_probe=kx.http_probe("/", otel_config.HEALTH_PORT),
                                readiness_probe=kx.http_probe("/", otel_config.HEALTH_PORT),
                                security_context=kx.security(uid=10001),
                                volume_mounts=[
                                    kx.mount("config", COLLECTOR_CONFIG_DIR, read_only=True)
                                ],
                            )
                        ],
                        volumes=[kx.config_volume("config", config_map_name(app))],
                    ),
                ),
            ),
            opts=child,
        )
        kx.pdb(app, ns, match, lbls, child, max_unavailable=1)


def _discovery_rules() -> list[k8s.rbac.v1.PolicyRuleArgs]:
    return [
        k8s.rbac.v1.PolicyRuleArgs(
            api_groups=[""],
            resources=["pods", "services", "endpoints", "nodes"],
            verbs=["get", "list", "watch"],
        ),
        k8s.rbac.v1.PolicyRuleArgs(
            api_groups=["discovery.k8s.io"],
            resources=["endpointslices"],
            verbs=["get", "list", "watch"],
        ),
    ]


def _tempo_config() -> dict[str, Any]:
    return {
        "server": {"http_listen_port": 3200},
        "distributor": {
            "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"0.0.0.0:{OTLP_GRPC}"}}}}
        },
        "storage": {
            "trace": {
                "backend": "local",
                "local": {"path": "/var/tempo/traces"},
                "wal": {"path": "/var/tempo/wal"},
            }
        },
        "compactor": {"compaction": {"block_retention": "168h"}},
    }
