"""The local Prometheus and Alertmanager run what the program renders: its rule groups are loaded,
the services' series keep the `service` label the SLO rules select, and the Watchdog travels
Prometheus -> Alertmanager -> heartbeat route -> the local webhook sink."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import httpx
import pytest

from infra import alert_rules, observability, platform
from infra.alert_rules import SERVICE_LABEL
from local import observability_render, observability_transforms
from tests.conftest import Stack

pytestmark = pytest.mark.stack

T = TypeVar("T")


def _eventually(probe: Callable[[], T | None], timeout: float, what: str) -> T:
    """The first truthy answer of `probe` within `timeout` seconds; fails naming `what`."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(1)
    raise AssertionError(f"{what} within {timeout:.0f}s; last answer: {last!r}")


def _prometheus(stack: Stack, path: str, **params: str) -> Any:
    r = httpx.get(f"{stack.prometheus_url}{path}", params=params, timeout=10)
    r.raise_for_status()
    return r.json()["data"]


def test_prometheus_loaded_the_rendered_rule_groups(stack: Stack) -> None:
    program = alert_rules.rule_groups(alert_rules.default_slos())["groups"]
    expected = {r["alert"] for g in program for r in g["rules"] if "alert" in r}
    loaded = _prometheus(stack, "/api/v1/rules")["groups"]
    assert {g["name"] for g in loaded} == {g["name"] for g in program}
    alerting = {r["name"] for g in loaded for r in g["rules"] if r["type"] == "alerting"}
    assert alerting == expected
    assert alert_rules.WATCHDOG in alerting and len(expected) == 11


def test_prometheus_scrapes_exactly_the_pods_the_program_annotates(stack: Stack) -> None:
    jobs = {c.name: c.metrics_targets() for c in stack.supervisor.components.values()}
    groups = observability_transforms.file_sd_groups(
        observability_render.load(stack.layout.stack), jobs, None
    )
    opted_in = {
        g["targets"][0]
        for g in groups
        if g["labels"].get(observability.sd_label("annotation", observability.SCRAPE_ANNOTATION))
        == "true"
    }
    ports = stack.layout.ports
    # the ops ports: the API ports need the gateway's client certificate
    assert {f"{stack.host}:{ports.write_ops}", f"{stack.host}:{ports.read_ops}"} <= opted_in

    def all_up() -> dict[str, str] | None:
        active = _prometheus(stack, "/api/v1/targets")["activeTargets"]
        health = {t["labels"]["instance"]: t["health"] for t in active}
        return health if set(health) == opted_in and set(health.values()) == {"up"} else None

    health = _eventually(all_up, 90, f"every opted-in target {sorted(opted_in)} up")
    assert set(health) == opted_in


@pytest.mark.parametrize("service", [alert_rules.WRITE, alert_rules.READ])
def test_scraped_series_keep_the_service_label_the_slo_rules_select(
    stack: Stack, service: str
) -> None:
    assert httpx.get(f"{stack.ops_url(service)}/healthz", timeout=5).status_code == 200
    query = f'likes_http_requests_total{{{SERVICE_LABEL}="{service}",route="/healthz"}}'

    def series() -> list[dict[str, Any]]:
        return list(_prometheus(stack, "/api/v1/query", query=query)["result"])

    (found, *_) = _eventually(series, 60, f"a scraped series for {query}")
    assert found["metric"]["namespace"] == platform.NS_APPS
    assert alert_rules.WORKLOAD_LABEL in found["metric"]
    # nothing was renamed out of the way by a clashing target label (review C5)
    clashes = _prometheus(stack, "/api/v1/query", query=f'{{exported_{SERVICE_LABEL}!=""}}')
    assert clashes["result"] == []


def _carries_watchdog(entry: dict[str, Any]) -> bool:
    # the sink also keeps other stand-ins' calls (Cloudflare purges): only notifications count
    alerts = entry["payload"].get("alerts", []) if isinstance(entry["payload"], dict) else []
    return any(a["labels"].get("alertname") == alert_rules.WATCHDOG for a in alerts)


def test_watchdog_reaches_the_webhook_sink_through_the_heartbeat_route(stack: Stack) -> None:
    sink = f"http://{stack.host}:{stack.layout.ports.webhook_sink}"

    def beats() -> list[dict[str, Any]]:
        entries = httpx.get(f"{sink}/{observability.HEARTBEAT_RECEIVER}", timeout=5).json()
        return [e for e in entries if _carries_watchdog(e)]

    (beat, *_) = _eventually(beats, 120, "a Watchdog notification at the sink's heartbeat path")
    # Alertmanager names the receiver whose route matched: the heartbeat, not a catch-all
    assert beat["payload"]["receiver"] == observability.HEARTBEAT_RECEIVER
    assert beat["payload"]["status"] == "firing"
    everything = httpx.get(f"{sink}/", timeout=5).json()
    elsewhere = [e["receiver"] for e in everything if _carries_watchdog(e)]
    assert set(elsewhere) == {observability.HEARTBEAT_RECEIVER}, elsewhere
