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
    observability,
    plan,
    platform,
    stackfile,
)
from infra.alert_rules import SERVICE_LABEL, WORKLOAD_LABEL
from local import observability_render, observability_transforms
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
    am = observability.in_cluster(
        "alertmanager", platform.NS_OBSERVABILITY, observability.ALERTMANAGER_PORT
    )
    cfg, files = observability_transforms.prometheus(
        r, {}, {am: "127.0.0.1:9093"}, rules_dir, tmp_path
    )
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
        value = rule.get("separator", ";").join(out.get(s, "") for s in rule["source_labels"])
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
        assert final["namespace"] == platform.NS_APPS


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
    selectors = [s.error_ratio for s in alert_rules.default_slos() if s.service == name]
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
    for labels in _alert_labels(r):
        is_watchdog = labels["alertname"] == alert_rules.WATCHDOG
        key = alert_rules.WATCHDOG if is_watchdog else labels["severity"]
        assert _amtool_route(path, labels) == [expected[key]], labels
        # the policy's route walker agrees with Alertmanager's own
        assert alert_routing.receivers_for(r.alertmanager, labels) == [expected[key]]
    # an alert nobody planned for still reaches a person
    unplanned = {"alertname": "X", "severity": "critical"}
    assert _amtool_route(path, unplanned) == [observability.TICKET_RECEIVER]
    receivers = {rc["name"]: rc for rc in r.alertmanager["receivers"]}
    assert receivers["heartbeat"]["webhook_configs"] == [
        {"url": o.heartbeat_url, "send_resolved": False}
    ]
    assert receivers["tickets"]["webhook_configs"] == [{"url": o.ticket_webhook_url}]
    assert "null" not in receivers


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
