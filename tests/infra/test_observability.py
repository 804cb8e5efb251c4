"""The rendered Prometheus and Alertmanager configs, under Pulumi's mocks: pinned to the versions
that run locally and valid for them, scrape relabeling that keeps the labels our code emits (C5),
and routes that take the Watchdog, pages and tickets somewhere (H3)."""

from __future__ import annotations

import importlib
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY

from infra import (
    alert_routing,
    alert_rules,
    config,
    exporters,
    kafka,
    observability,
    otel_config,
    plan,
    platform,
    redis,
    scylla,
    stackfile,
)
from infra.alert_rules import SERVICE_LABEL, WORKLOAD_LABEL
from local import observability_render, observability_transforms, otelcol
from local.components.observability import Prometheus
from local.layout import REPO_ROOT, Layout, Ports
from tests.infra.conftest import STACKS, named, tool

STATEFULSET = "kubernetes:apps/v1:StatefulSet"


def _rendered(p: plan.Plan) -> observability_render.Rendered:
    return observability_render.from_plan(p)


# --- versions ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("binary", "package", "pinned"),
    [
        ("prometheus", "prometheus", observability.PROMETHEUS_VERSION),
        ("promtool", "prometheus", observability.PROMETHEUS_VERSION),
        ("prometheus-alertmanager", "prometheus-alertmanager", observability.ALERTMANAGER_VERSION),
        ("amtool", "prometheus-alertmanager", observability.ALERTMANAGER_VERSION),
    ],
)
def test_local_binaries_are_the_versions_the_program_pins(
    binary: str, package: str, pinned: str
) -> None:
    proc = subprocess.run(
        [tool(binary, package), "--version"], capture_output=True, text=True, timeout=30
    )
    text = proc.stdout + proc.stderr
    found = re.search(r"version (\d+\.\d+\.\d+)", text)
    assert found, f"no version in `{binary} --version`: {text!r}"
    assert found.group(1) == pinned, (
        f"the local {binary} is {found.group(1)} but infra/observability.py pins {pinned}: the "
        "local stack and these tests would check configs against another version than production "
        "runs. Move the pin (PROMETHEUS_VERSION / ALERTMANAGER_VERSION) and the local package "
        "together."
    )


@pytest.mark.parametrize("stack", STACKS)
def test_images_are_the_pinned_versions(plans: dict[str, plan.Plan], stack: str) -> None:
    def image(app: str) -> str:
        (container,) = named(plans[stack], "StatefulSet", app).inputs["spec"]["template"]["spec"][
            "containers"
        ]
        return str(container["image"])

    assert image("prometheus") == f"prom/prometheus:v{observability.PROMETHEUS_VERSION}"
    assert image("alertmanager") == f"prom/alertmanager:v{observability.ALERTMANAGER_VERSION}"
    for kind, tier in (("Deployment", otel_config.COLLECTOR), ("StatefulSet", otel_config.SAMPLER)):
        (container,) = named(plans[stack], kind, tier).inputs["spec"]["template"]["spec"][
            "containers"
        ]
        assert container["image"] == observability.COLLECTOR_IMAGE


def test_the_local_collector_is_the_release_the_program_runs() -> None:
    binary = REPO_ROOT / ".cache" / "bin" / otelcol.BINARY
    assert binary.exists(), f"{binary} is missing: local/setup.sh builds it"
    proc = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30)
    assert proc.stdout.split()[-1] == otel_config.COLLECTOR_VERSION, proc.stdout
    assert observability.COLLECTOR_IMAGE.endswith(f":{otel_config.COLLECTOR_VERSION}")


@pytest.mark.parametrize("stack", STACKS)
def test_both_collector_tiers_serve_their_metrics_to_the_pods_job(
    plans: dict[str, plan.Plan], stack: str
) -> None:
    r = _rendered(plans[stack])
    for tier in (otel_config.COLLECTOR, otel_config.SAMPLER):
        pod = r.pod(tier)
        assert pod is not None, tier
        assert pod.annotations[observability.SCRAPE_ANNOTATION] == "true"
        assert pod.annotations[observability.PORT_ANNOTATION] == str(otel_config.METRICS_PORT)
    (reader,) = r.collector["service"]["telemetry"]["metrics"]["readers"]
    assert reader["pull"]["exporter"]["prometheus"]["port"] == otel_config.METRICS_PORT


# --- the rendered configs load in the pinned versions ------------------------------------------


@pytest.mark.parametrize("stack", STACKS)
def test_rendered_prometheus_config_and_rules_pass_promtool(
    plans: dict[str, plan.Plan], stack: str, tmp_path: Path
) -> None:
    """promtool checks the config the local stack runs: Debian builds Prometheus without
    Kubernetes SD, so its pod discovery is swapped for file_sd exactly as locally (transform 1);
    the rest of the file, rules included, is checked as rendered."""
    r = _rendered(plans[stack])
    for sd in r.prometheus["scrape_configs"][0]["kubernetes_sd_configs"]:
        # what the swap cannot check: the SD block itself, against the 2.42 schema
        assert set(sd) <= {"role", "namespaces"} and sd["role"] == "pod"
        assert set(sd["namespaces"]) == {"names"} and all(sd["namespaces"]["names"])
    rules_dir = tmp_path / "rules"
    rules_dir.mkdir()
    for name, text in r.rules.items():
        (rules_dir / name).write_text(text)
    # the local stack's own table of in-cluster addresses (transform 2)
    local = Prometheus(Layout(home=tmp_path, ports=Ports()), dict)
    cfg, files = observability_transforms.prometheus(r, {}, local.addresses(), rules_dir, tmp_path)
    for path, groups in files.items():
        path.write_text(yaml.safe_dump(groups))
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    proc = subprocess.run(
        [tool("promtool", "prometheus"), "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 1 rule files found" in proc.stdout


@pytest.mark.parametrize("stack", STACKS)
def test_rendered_alertmanager_config_passes_amtool(
    plans: dict[str, plan.Plan], stack: str, tmp_path: Path
) -> None:
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(_rendered(plans[stack]).alertmanager))
    proc = subprocess.run(
        [tool("amtool", "prometheus-alertmanager"), "check-config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- relabeling keeps the labels our code emits (C5) -------------------------------------------


def _relabel(labels: dict[str, str], rules: list[dict[str, Any]]) -> dict[str, str] | None:
    """Prometheus's relabeling for the actions the rendered config uses (None: target dropped)."""
    out = dict(labels)
    for rule in rules:
        action = rule.get("action", "replace")
        sources = rule.get("source_labels", [])
        value = rule.get("separator", ";").join(out.get(s, "") for s in sources)
        match = re.fullmatch(rule.get("regex", "(.*)"), value)
        if action == "keep":
            if match is None:
                return None
        elif action == "replace":
            if match is not None:
                template = re.sub(r"\$\{?(\d+)\}?", r"\\g<\1>", rule.get("replacement", "$1"))
                result = match.expand(template)
                if result:
                    out[rule["target_label"]] = result
                else:
                    out.pop(rule["target_label"], None)
        else:
            raise AssertionError(f"the simulator does not know action {action!r}")
    return out


def _scrape(target: dict[str, str], sample: dict[str, str]) -> dict[str, str]:
    """A scraped sample's final labels, honor_labels false: a clash renames the sample's label."""
    out = {(f"exported_{k}" if k in target else k): v for k, v in sample.items()}
    return {**out, **target}


def _pod_targets(p: plan.Plan) -> list[tuple[str, dict[str, str]]]:
    """(workload, target labels after relabeling) for every rendered pod the scrape keeps."""
    scrape = _rendered(p).prometheus["scrape_configs"][0]
    (sd,) = scrape["kubernetes_sd_configs"]
    kept = []
    for pod in _rendered(p).pods:
        if pod.namespace not in sd["namespaces"]["names"]:
            continue
        meta = observability_transforms.sd_labels(pod, f"{pod.name}-abc12", 8080)
        meta |= {"__address__": "10.1.2.3:8080", "job": scrape["job_name"]}
        meta |= {"__metrics_path__": "/metrics", "__scheme__": "http"}
        target = _relabel(meta, scrape["relabel_configs"])
        if target is not None:
            target.setdefault("instance", target["__address__"])
            kept.append((pod.name, {k: v for k, v in target.items() if not k.startswith("__")}))
    return kept


@pytest.mark.parametrize("stack", STACKS)
def test_relabeling_keeps_the_service_label_the_code_emits(
    plans: dict[str, plan.Plan], stack: str
) -> None:
    targets = _pod_targets(plans[stack])
    names = {name for name, _ in targets}
    assert len(names) >= 5 and {"aggregator", "outbox-relay", "hotkey-sampler"} <= names, names
    for name, target in targets:
        sample = {"__name__": "likes_http_requests_total", SERVICE_LABEL: "from-the-code"}
        final = _scrape(target, sample)
        assert final[SERVICE_LABEL] == "from-the-code", (name, final)
        assert f"exported_{SERVICE_LABEL}" not in final
        assert final[WORKLOAD_LABEL] == name
        assert final["namespace"] == pod_namespace(plans[stack], name)


def pod_namespace(p: plan.Plan, workload: str) -> str:
    (pod,) = {pod.namespace for pod in _rendered(p).pods if pod.name == workload}
    return pod


def _code_label_names() -> set[str]:
    # every module that declares metrics, imported so that their collectors are registered
    for module in (
        "operators.hotkeys.local_loop",
        "services.aggregator.core",
        "services.aggregator.metrics",
        "services.common.http",
        "services.hotkey_sampler.main",
        "services.read.hotkeys",
        "services.read.metrics",
        "services.relay.core",
    ):
        importlib.import_module(module)
    names: set[str] = set()
    for collector in list(REGISTRY._collector_to_names):
        names.update(getattr(collector, "_labelnames", ()))
    return names


def test_scrape_attaches_no_label_our_code_emits(plans: dict[str, plan.Plan]) -> None:
    emitted = _code_label_names()
    assert {SERVICE_LABEL, "route", "status"} <= emitted
    attached = {label for _, target in _pod_targets(plans["staging"]) for label in target}
    attached |= set(_rendered(plans["staging"]).prometheus["global"]["external_labels"])
    assert not attached & emitted, f"the scrape would rename the code's {attached & emitted}"


@pytest.mark.parametrize(
    ("module", "name"),
    [("services.write.main", alert_rules.WRITE), ("services.read.main", alert_rules.READ)],
)
def test_code_labels_requests_with_the_service_the_slo_rules_select(module: str, name: str) -> None:
    from services.contracts.settings import HotPoolSettings

    app = importlib.import_module(module).create_app(HotPoolSettings(env="local"))
    labels = {SERVICE_LABEL: name, "route": "/healthz", "status": "200"}
    before = REGISTRY.get_sample_value("likes_http_requests_total", labels) or 0.0
    assert TestClient(app).get("/healthz").status_code == 200  # no lifespan: no stores needed
    assert REGISTRY.get_sample_value("likes_http_requests_total", labels) == before + 1
    # every SLO of the service that reads the RED series selects them by that label
    selectors = [
        s.error_ratio
        for s in alert_rules.default_slos()
        if s.service == name and "likes_http_" in s.error_ratio
    ]
    assert selectors and all(f'{SERVICE_LABEL}="{name}"' in s for s in selectors)


# --- Alertmanager routes (H3) ------------------------------------------------------------------


def _amtool_route(path: Path, labels: dict[str, str]) -> list[str]:
    proc = subprocess.run(
        [
            tool("amtool", "prometheus-alertmanager"),
            "config",
            "routes",
            "test",
            f"--config.file={path}",
            *(f"{k}={v}" for k, v in labels.items()),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(",")


def _alert_labels(r: observability_render.Rendered) -> list[dict[str, str]]:
    rules = [
        rule
        for text in r.rules.values()
        for group in yaml.safe_load(text)["groups"]
        for rule in group["rules"]
        if "alert" in rule
    ]
    return [{**rule["labels"], "alertname": rule["alert"]} for rule in rules]


@pytest.mark.parametrize("stack", STACKS)
def test_watchdog_pages_and_tickets_reach_their_receivers(
    plans: dict[str, plan.Plan], configs: dict[str, config.StackConfig], stack: str, tmp_path: Path
) -> None:
    r = _rendered(plans[stack])
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(r.alertmanager))
    o = configs[stack].observability
    pager = observability.PAGER_RECEIVER  # the offline plan stands a placeholder in for the key
    expected = {
        alert_rules.WATCHDOG: observability.HEARTBEAT_RECEIVER,
        alert_rules.SEVERITY_PAGE: pager,
        alert_rules.SEVERITY_TICKET: observability.TICKET_RECEIVER,
    }
    abuse_pages = 0
    for labels in _alert_labels(r):
        is_watchdog = labels["alertname"] == alert_rules.WATCHDOG
        key = alert_rules.WATCHDOG if is_watchdog else labels["severity"]
        want = expected[key]
        if labels.get(alert_rules.TEAM_LABEL) == alert_rules.ABUSE_TEAM and key == "page":
            want, abuse_pages = observability.ABUSE_RECEIVER, abuse_pages + 1
        assert _amtool_route(path, labels) == [want], labels
        # the policy's route walker agrees with Alertmanager's own
        assert alert_routing.receivers_for(r.alertmanager, labels) == [want]
    assert abuse_pages >= 1  # the storm page reaches the abuse team
    # an alert nobody planned for still reaches a person
    unplanned = {"alertname": "X", "severity": "critical"}
    assert _amtool_route(path, unplanned) == [observability.TICKET_RECEIVER]
    receivers = {rc["name"]: rc for rc in r.alertmanager["receivers"]}
    assert receivers["heartbeat"]["webhook_configs"] == [
        {"url": o.heartbeat_url, "send_resolved": False}
    ]
    assert receivers["tickets"]["webhook_configs"] == [{"url": o.ticket_webhook_url}]
    assert "null" not in receivers


def test_each_inhibition_names_a_page_and_an_alert_the_rules_define() -> None:
    """An inhibit rule naming an alert nobody defines (a rename) silently holds back nothing,
    and a source that is not a page could hide a page behind a ticket."""
    groups = alert_rules.rule_groups(alert_rules.default_slos())["groups"]
    severities: dict[str, set[str]] = {}
    for g in groups:
        for r in g["rules"]:
            if "alert" in r:
                severities.setdefault(r["alert"], set()).add(r["labels"]["severity"])
    write = [s for s in alert_rules.default_slos() if s.name == "write-availability"]
    assert [alert_rules.alert_name(s) for s in write] == [alert_rules.WRITE_AVAILABILITY_BURN]
    assert alert_rules.INHIBITIONS
    for inh in alert_rules.INHIBITIONS:
        assert alert_rules.SEVERITY_PAGE in severities[inh.source], inh
        assert inh.target in severities and inh.target != inh.source, inh
    cfg = observability.alertmanager_config(
        True, observability.AlertReceivers("https://t.example.com/hook")
    )
    rendered = {
        (r["source_matchers"][0], r["target_matchers"][0], tuple(r["equal"]))
        for r in cfg["inhibit_rules"]
    }
    assert rendered == {
        (f'alertname="{i.source}"', f'alertname="{i.target}"', ("region",))
        for i in alert_rules.INHIBITIONS
    }


def test_pages_go_to_tickets_without_a_pagerduty_key() -> None:
    cfg = observability.alertmanager_config(
        False, observability.AlertReceivers("https://t.example.com/hook")
    )
    assert alert_routing.receivers_for(cfg, {"alertname": "A", "severity": "page"}) == ["tickets"]
    assert alert_routing.receivers_for(cfg, {"alertname": "Watchdog", "severity": "none"}) == [
        "heartbeat"
    ]
    # no heartbeat URL: the Watchdog is still routed to the heartbeat receiver, which sends nothing
    assert alert_routing.integrations(cfg, "heartbeat") == []
    assert alert_routing.integrations(cfg, "tickets") == ["webhook"]


@pytest.mark.parametrize(
    ("pager", "abuse_pager", "integration", "key_file"),
    [(True, True, "pagerduty", observability.ABUSE_PAGERDUTY_KEY),
     (True, False, "pagerduty", observability.PAGERDUTY_KEY),
     (False, False, "webhook", None)],
)  # fmt: skip
def test_the_abuse_teams_pages_reach_their_pager_else_the_platforms_else_tickets(
    pager: bool, abuse_pager: bool, integration: str, key_file: str | None
) -> None:
    cfg = observability.alertmanager_config(
        pager, observability.AlertReceivers("https://t.example.com/hook"), abuse_pager
    )
    page = {"alertname": alert_rules.ABUSE_STORM, "severity": "page",
            alert_rules.TEAM_LABEL: alert_rules.ABUSE_TEAM}  # fmt: skip
    assert alert_routing.receivers_for(cfg, page) == [observability.ABUSE_RECEIVER]
    assert alert_routing.integrations(cfg, observability.ABUSE_RECEIVER) == [integration]
    (receiver,) = [r for r in cfg["receivers"] if r["name"] == observability.ABUSE_RECEIVER]
    if key_file is not None:
        (pd,) = receiver["pagerduty_configs"]
        assert pd["routing_key_file"] == f"{observability.PAGERDUTY_DIR}/{key_file}"
    # the team's tickets, and the platform's pages, go where they always went
    ticket = {**page, "severity": "ticket"}
    assert alert_routing.receivers_for(cfg, ticket) == [observability.TICKET_RECEIVER]
    platform = {"alertname": "A", "severity": "page"}
    want = observability.PAGER_RECEIVER if pager else observability.TICKET_RECEIVER
    assert alert_routing.receivers_for(cfg, platform) == [want]


def test_heartbeat_repeats_within_the_seed_period() -> None:
    cfg = observability.alertmanager_config(
        True, observability.AlertReceivers("https://t.example.com/hook", "https://hb.example/x")
    )
    (watchdog,) = [r for r in cfg["route"]["routes"] if r["receiver"] == "heartbeat"]
    assert watchdog["group_wait"] == "0s" and watchdog["repeat_interval"] == "5m"


def test_program_passes_each_stacks_alert_receivers(plans: dict[str, plan.Plan]) -> None:
    for stack, p in plans.items():
        sf = stackfile.load(stack)
        o = yaml.safe_load(sf.values["likes:observability"])
        cfg = observability_render.from_plan(p).alertmanager
        urls = {
            r["name"]: [w["url"] for w in r.get("webhook_configs", [])] for r in cfg["receivers"]
        }
        assert urls[observability.TICKET_RECEIVER] == [o["ticketWebhookUrl"]], stack
        if o.get("heartbeatUrl"):
            assert urls[observability.HEARTBEAT_RECEIVER] == [o["heartbeatUrl"]], stack


# --- datastores and the metrics plane are scraped (issue 11, item 1) ---------------------------


@pytest.mark.parametrize("stack", STACKS)
def test_every_datastore_and_the_metrics_plane_are_scraped_by_the_pods_job(
    plans: dict[str, plan.Plan], stack: str
) -> None:
    names = {name for name, _ in _pod_targets(plans[stack])}
    expected = {kafka.KAFKA_APP, scylla.SCYLLA_APP, "etcd", "prometheus", "alertmanager"}
    assert expected <= names, expected - names
    ports = {
        pod.name: pod.annotations[observability.PORT_ANNOTATION]
        for pod in _rendered(plans[stack]).pods
        if pod.name in expected
    }
    assert ports[kafka.KAFKA_APP] == str(exporters.STRIMZI_METRICS_PORT)
    assert ports[scylla.SCYLLA_APP] == str(exporters.SCYLLA_METRICS_PORT)


@pytest.mark.parametrize("stack", STACKS)
def test_kafka_nodes_run_the_jmx_exporter_with_the_repositorys_rules(
    plans: dict[str, plan.Plan], stack: str
) -> None:
    p = plans[stack]
    (cluster,) = [r for r in p.resources if r.inputs.get("kind") == "Kafka"]
    ref = cluster.inputs["spec"]["kafka"]["metricsConfig"]
    assert ref["type"] == "jmxPrometheusExporter"
    key = ref["valueFrom"]["configMapKeyRef"]
    config_map = named(p, "ConfigMap", key["name"], cluster.inputs["metadata"]["namespace"])
    text = config_map.inputs["data"][key["key"]]
    assert text == exporters.KAFKA_JMX_RULES.read_text()
    rules = yaml.safe_load(text)
    # an allow-list: a scrape reads only the MBeans the rules use
    assert rules["includeObjectNames"] and rules["rules"]
    pools = [r for r in p.resources if r.inputs.get("kind") == "KafkaNodePool"]
    assert {r.inputs["spec"]["roles"][0] for r in pools} == {"broker", "controller"}
    for pool in pools:
        meta = pool.inputs["spec"]["template"]["pod"]["metadata"]
        assert meta["annotations"] == observability.scrape_annotations(
            exporters.STRIMZI_METRICS_PORT
        )


@pytest.mark.parametrize("stack", STACKS)
def test_every_redis_is_scraped_through_the_one_exporter(
    plans: dict[str, plan.Plan], stack: str
) -> None:
    p = plans[stack]
    r = _rendered(p)
    (job,) = [j for j in r.prometheus["scrape_configs"] if j["job_name"] == exporters.REDIS_JOB]
    assert job["metrics_path"] == exporters.REDIS_SCRAPE_PATH
    exporter = named(p, "Deployment", exporters.REDIS_EXPORTER, platform.NS_DATA)
    (container,) = exporter.inputs["spec"]["template"]["spec"]["containers"]
    assert container["image"] == exporters.REDIS_EXPORTER_IMAGE
    (password,) = [e for e in container["env"] if e["name"] == "REDIS_PASSWORD"]
    assert password["valueFrom"]["secretKeyRef"]["name"] == redis.AUTH_SECRET
    service = named(p, "Service", exporters.REDIS_EXPORTER, platform.NS_DATA)
    (port,) = service.inputs["spec"]["ports"]
    address = observability.in_cluster(exporters.REDIS_EXPORTER, platform.NS_DATA, port["port"])
    (sd,) = job["kubernetes_sd_configs"]
    scraped: dict[str, dict[str, str]] = {}
    for pod in r.pods:
        if pod.namespace not in sd["namespaces"]["names"]:
            continue
        meta = observability_transforms.sd_labels(pod, f"{pod.name}-0", redis.PORT)
        meta |= {"__address__": f"10.1.2.3:{redis.PORT}"}
        target = _relabel(meta, job["relabel_configs"])
        if target is not None:
            scraped[pod.name] = target
    roles = {pod.name for pod in r.pods if redis.ROLE_LABEL in pod.labels}
    assert {"count-cache", "idem-store", "feature-store", "hot-pool-0"} <= roles
    assert set(scraped) == roles  # every Redis, and nothing else
    for name, target in scraped.items():
        assert target["__address__"] == address, name  # the scrape goes to the exporter
        assert target["__param_target"] == f"redis://10.1.2.3:{redis.PORT}"  # for this Redis
        assert target["instance"] == target["__param_target"]
        assert target[WORKLOAD_LABEL] == name and target["namespace"] == platform.NS_DATA


def test_the_local_redis_exporter_is_the_version_the_program_runs() -> None:
    proc = subprocess.run(
        [tool("prometheus-redis-exporter", "prometheus-redis-exporter"), "--version"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    found = re.search(r"Exporter v?(\d+\.\d+\.\d+)", proc.stdout + proc.stderr)
    assert found, proc.stdout + proc.stderr
    assert exporters.REDIS_EXPORTER_IMAGE.endswith(f":v{found.group(1)}")
