"""The local Prometheus and Alertmanager run what the program renders: its rule groups are loaded,
the services' series keep the `service` label the SLO rules select, and the Watchdog travels
Prometheus -> Alertmanager -> heartbeat route -> the local webhook sink."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import httpx
import pytest

from infra import alert_rules, exporters, observability, platform
from infra.alert_rules import SERVICE_LABEL
from local import observability_render, observability_transforms
from services.contracts import metrics as metric_names
from services.contracts import workloads as wl
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
    assert alert_rules.WATCHDOG in alerting and alert_rules.ABUSE_STORM in alerting
    # the time scale is the one difference: each `for` 1/60 of the program's (15 m -> 15 s)
    rendered_for = {
        (r["alert"], r.get("labels", {}).get("reason")): r.get("for", "0s")
        for g in program
        for r in g["rules"]
        if "alert" in r and "long_window" not in r.get("labels", {})
    }
    for g in loaded:
        for r in g["rules"]:
            key = (r["name"], r["labels"].get("reason"))
            if r["type"] == "alerting" and key in rendered_for:
                want = observability_transforms.seconds(rendered_for[key]) / 60
                assert r["duration"] == want, (key, r["duration"], want)
    purge = [r for g in loaded for r in g["rules"] if r["name"] == alert_rules.CDN_PURGE_FAILING]
    assert purge[0]["duration"] == 15  # rendered "15m"


def _expected_targets(stack: Stack) -> dict[str, set[str]]:
    """job -> the instances Prometheus must scrape: every component's targets as the workload it
    plays, kept as the rendered relabeling keeps them (the pods job: scrape-annotated pods; the
    redis job: Redis pods, named by their redis:// address)."""
    jobs: dict[str, list[str]] = {}
    for c in stack.supervisor.components.values():
        for workload, addresses in c.scrape_targets().items():
            jobs.setdefault(workload, []).extend(addresses)
    groups = observability_transforms.file_sd_groups(
        observability_render.load(stack.layout.stack), jobs, None
    )

    def opted(g: dict[str, Any], annotation: str) -> bool:
        return g["labels"].get(observability.sd_label("annotation", annotation)) == "true"

    def port_name(g: dict[str, Any]) -> str | None:
        return g["labels"].get("__meta_kubernetes_pod_container_port_name")

    return {
        # a named container port of an annotated pod is rewritten to the annotated port: the
        # pod's own target again (one target, as Prometheus keeps one of identical ones)
        "pods": {
            g["targets"][0]
            for g in groups
            if opted(g, observability.SCRAPE_ANNOTATION) and port_name(g) is None
        },
        observability.SIDECAR_JOB: {
            g["targets"][0] for g in groups if port_name(g) == wl.SIDECAR_METRICS_PORT
        },
        exporters.REDIS_JOB: {
            f"redis://{g['targets'][0]}"
            for g in groups
            if opted(g, exporters.REDIS_SCRAPE_ANNOTATION)
        },
    }


def test_prometheus_scrapes_exactly_what_the_program_annotates_and_all_is_up(
    stack: Stack,
) -> None:
    expected = _expected_targets(stack)
    ports, host = stack.layout.ports, stack.host
    # the ops ports (the API ports need the gateway's client certificate), every datastore's
    # exporter and the metrics plane itself
    assert {
        f"{host}:{p}"
        for p in (
            ports.write_ops,
            ports.read_ops,
            ports.etcd_metrics,
            ports.cassandra_metrics,
            ports.prometheus,
            ports.alertmanager,
            *ports.kafka_metrics,
        )
    } <= expected["pods"]
    # the abuse model server, the scorer's sidecar, by its container port's name
    assert expected[observability.SIDECAR_JOB] == {f"{host}:{ports.abuse_model_ops}"}
    redis_ports = (*ports.count_cache, *ports.idem_store, *ports.feature_store, *ports.hot_pools)
    assert expected[exporters.REDIS_JOB] == {f"redis://{host}:{p}" for p in redis_ports}

    def all_up() -> dict[str, dict[str, str]] | None:
        active = _prometheus(stack, "/api/v1/targets")["activeTargets"]
        health: dict[str, dict[str, str]] = {job: {} for job in expected}
        for t in active:
            health.setdefault(t["labels"]["job"], {})[t["labels"]["instance"]] = t["health"]
        same = {job: set(found) for job, found in health.items()} == expected
        up = all(set(found.values()) == {"up"} for found in health.values())
        return health if same and up else None

    _eventually(all_up, 120, f"every expected target up: {expected}")


def _any(_value: float) -> bool:
    return True


def _is(expected: float) -> Callable[[float], bool]:
    return lambda value: value == expected


@pytest.mark.parametrize(
    ("query", "workloads", "per_workload", "healthy"),
    [
        # the brokers' JMX exporter (infra/jmx/kafka.yaml): 0 on a healthy cluster
        ("kafka_server_replicamanager_underreplicatedpartitions", ("kafka",), 3, _is(0)),
        ("kafka_controller_kafkacontroller_activebrokercount", ("kafka",), 3, _any),
        # Cassandra's (infra/jmx/cassandra.yaml), as the workload it plays
        ("cassandra_storage_load_bytes", ("scylla",), 1, _any),
        (
            'cassandra_clientrequest_latency_seconds{scope="Read",quantile="0.99"}',
            ("scylla",),
            1,
            _any,
        ),
        # every Redis through the one exporter, 1 = it answered
        ("redis_up", ("count-cache", "idem-store"), 6, _is(1)),
        ("redis_up", ("hot-pool-0", "hot-pool-1", "hot-pool-2", "hot-pool-3"), 1, _is(1)),
        # the SLIs recorded from them (infra/alert_rules.py sli_rules): one skew for the
        # cluster (max over mean of 3 primaries), one replication lag per primary
        (alert_rules.REDIS_SHARD_QPS_SKEW, ("count-cache",), 1, lambda v: 1.0 <= v <= 3.0),
        (alert_rules.REPLICATION_LAG_SECONDS, ("count-cache",), 3, _any),
        ("etcd_server_has_leader", ("etcd",), 1, _is(1)),
        ("prometheus_tsdb_head_series", ("prometheus",), 1, _any),
        ("alertmanager_cluster_enabled", ("alertmanager",), 1, _any),
        # the scorer's sidecar, found by its container port's name (the pod-sidecars job)
        (metric_names.ABUSE_MODEL_SERVING, ("abuse-model",), 1, _is(1)),
    ],
)
def test_each_datastore_exporter_serves_its_use_series(
    stack: Stack,
    query: str,
    workloads: tuple[str, ...],
    per_workload: int,
    healthy: Callable[[float], bool],
) -> None:
    """The series, as many as the workloads have servers, each reading healthy (an earlier test
    may have restarted a server: its first scrapes can say so, the stack must get back)."""

    def series() -> dict[str, list[float]] | None:
        found: dict[str, list[float]] = {}
        for r in _prometheus(stack, "/api/v1/query", query=query)["result"]:
            found.setdefault(r["metric"].get(alert_rules.WORKLOAD_LABEL, ""), []).append(
                float(r["value"][1])
            )
        counted = all(len(found.get(w, [])) == per_workload for w in workloads)
        ok = counted and all(healthy(v) for w in workloads for v in found[w])
        return found if ok else None

    _eventually(series, 90, f"{query}: {per_workload} healthy series for each of {workloads}")


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


def test_a_write_burn_page_holds_back_outbox_shards_unowned_in_its_own_region_only(
    stack: Stack,
) -> None:
    """The rendered inhibit rules, in the stack's Alertmanager: each INHIBITIONS source paging
    holds back its target in the same region (suppressed, inhibited by the source), not the
    target of another region, and a ticket-severity source holds back nothing."""
    am = f"http://{stack.host}:{stack.layout.ports.alertmanager}/api/v2/alerts"
    start = datetime.now(UTC)
    later = start + timedelta(minutes=10)

    def alert(name: str, region: str, severity: str, tag: str) -> dict[str, Any]:
        return {
            "labels": {"alertname": name, "region": region, "severity": severity, "test": tag},
            "startsAt": start.isoformat(),
            "endsAt": later.isoformat(),
        }

    assert alert_rules.INHIBITIONS
    for inh in alert_rules.INHIBITIONS:
        tag = uuid.uuid4().hex[:8]  # one per inhibition: each round sees only its own alerts
        here, there, quiet = f"r-{tag}", f"other-{tag}", f"ticket-{tag}"
        page, ticket = alert_rules.SEVERITY_PAGE, alert_rules.SEVERITY_TICKET
        sent = [
            alert(inh.source, here, page, tag),
            alert(inh.target, here, page, tag),
            alert(inh.target, there, page, tag),
            alert(inh.source, quiet, ticket, tag),
            alert(inh.target, quiet, page, tag),
        ]
        httpx.post(am, json=sent, timeout=10).raise_for_status()
        try:

            def states(
                target: str = inh.target, tag: str = tag, here: str = here
            ) -> dict[tuple[str, str], dict[str, Any]] | None:
                got = httpx.get(am, params={"filter": f'test="{tag}"'}, timeout=10).json()
                by = {(a["labels"]["alertname"], a["labels"]["region"]): a for a in got}
                held = len(by) == 5 and by[(target, here)]["status"]["state"] == "suppressed"
                return by if held else None

            by = _eventually(states, 60, f"{inh.target} suppressed by {inh.source}")
            source = by[(inh.source, here)]
            assert source["status"]["state"] == "active"
            assert by[(inh.target, here)]["status"]["inhibitedBy"] == [source["fingerprint"]]
            # held for a few evaluations: the other region's and the ticket's targets stay active
            for _ in range(3):
                time.sleep(1)
                by = states() or {}
                assert by[(inh.target, there)]["status"]["state"] == "active", by
                assert by[(inh.target, quiet)]["status"]["state"] == "active", by
                assert by[(inh.target, here)]["status"]["state"] == "suppressed", by
        finally:  # resolved at once, so no later test sees them firing
            now = datetime.now(UTC)
            done = [{**a, "endsAt": now.isoformat()} for a in sent]
            httpx.post(am, json=done, timeout=10).raise_for_status()
