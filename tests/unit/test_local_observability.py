"""The local stack's observability: only the listed transforms change the rendered configs, the
file_sd targets carry what Kubernetes SD would attach, the webhook sink keeps what arrives, and the
render is cached by the hash of its sources."""

from __future__ import annotations

import copy
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from infra import exporters
from infra import observability as obs
from local import observability_transforms as transforms
from local import rendered, webhook_sink
from local.observability_render import Pod, Rendered

AM_IN_CLUSTER = obs.in_cluster("alertmanager", "likes-observability", obs.ALERTMANAGER_PORT)
AM_LOCAL = "127.0.0.1:9093"
SCRAPED = {"prometheus.io/scrape": "true", "prometheus.io/port": "8080", "prometheus.io/path": "/m"}


def _render(
    heartbeat: str | None = "https://hb.example/x", redis_exporter: str | None = None
) -> Rendered:
    args = obs.ObservabilityArgs(
        namespace="likes-observability",
        cluster_name="c",
        region="r",
        mimir_remote_write_url="https://mimir.example/push",
        prometheus_retention="1d",
        prometheus_storage_gi=1,
        tempo_storage_gi=1,
        collector_replicas=1,
        latency_threshold_ms=1,
        healthy_percent=1.0,
        pagerduty_routing_key="k",
        scrape_namespaces=["likes", "likes-data"],
        receivers=obs.AlertReceivers("https://t.example.com/hook", heartbeat),
        redis_exporter=redis_exporter,
    )
    return Rendered(
        prometheus=obs.prometheus_config(args, AM_IN_CLUSTER),
        rules={"likes.rules.yml": "groups: []\n"},
        alertmanager=obs.alertmanager_config(
            True, obs.AlertReceivers("https://t.example/hook", heartbeat)
        ),
        pods=[
            Pod(
                "likes",
                {obs.NAME_LABEL: "write", "app.kubernetes.io/part-of": "likes"},
                SCRAPED,
            ),
            Pod("likes", {obs.NAME_LABEL: "aggregator"}, {**SCRAPED, "prometheus.io/port": "9100"}),
            Pod("likes-data", {obs.NAME_LABEL: "etcd"}, {}),
            Pod("likes-observability", {obs.NAME_LABEL: "prometheus"}, {}),
            Pod("likes-data", {obs.NAME_LABEL: "count-cache"}, exporters.redis_annotations(6379)),
        ],
    )


JOBS = {
    "write": ["127.0.0.1:8100"],
    "aggregator": ["127.0.0.1:8400"],
    "etcd": ["127.0.0.1:2379"],
    "prometheus": ["127.0.0.1:9090"],
    "cassandra": ["127.0.0.1:9042"],
}


def test_file_sd_targets_carry_the_labels_kubernetes_sd_would_attach() -> None:
    groups = transforms.file_sd_groups(_render(), JOBS, ["likes", "likes-data"])
    by_target = {g["targets"][0]: g["labels"] for g in groups}
    # prometheus: its namespace is not watched; cassandra: no such pod in the cluster
    assert set(by_target) == {"127.0.0.1:8100", "127.0.0.1:8400", "127.0.0.1:2379"}
    write = by_target["127.0.0.1:8100"]
    assert write == {
        "__meta_kubernetes_namespace": "likes",
        "__meta_kubernetes_pod_name": "write-local-0",
        "__meta_kubernetes_pod_label_app_kubernetes_io_name": "write",
        "__meta_kubernetes_pod_labelpresent_app_kubernetes_io_name": "true",
        "__meta_kubernetes_pod_label_app_kubernetes_io_part_of": "likes",
        "__meta_kubernetes_pod_labelpresent_app_kubernetes_io_part_of": "true",
        "__meta_kubernetes_pod_annotation_prometheus_io_scrape": "true",
        "__meta_kubernetes_pod_annotationpresent_prometheus_io_scrape": "true",
        # the one in-cluster fact replaced: the port the local process listens on
        "__meta_kubernetes_pod_annotation_prometheus_io_port": "8100",
        "__meta_kubernetes_pod_annotationpresent_prometheus_io_port": "true",
        "__meta_kubernetes_pod_annotation_prometheus_io_path": "/m",
        "__meta_kubernetes_pod_annotationpresent_prometheus_io_path": "true",
    }
    assert by_target["127.0.0.1:8400"]["__meta_kubernetes_pod_annotation_prometheus_io_port"] == (
        "8400"
    )
    # etcd is listed as the SD would find it; not annotated, the rendered keep rule drops it
    assert (
        "__meta_kubernetes_pod_annotation_prometheus_io_scrape" not in by_target["127.0.0.1:2379"]
    )
    everywhere = transforms.file_sd_groups(_render(), JOBS, None)
    assert len(everywhere) == 4  # no namespace list: every namespace, as Kubernetes SD does


EXPORTER_IN_CLUSTER = obs.in_cluster(exporters.REDIS_EXPORTER, "likes-data", 9121)


def test_the_redis_job_asks_the_local_exporter_for_each_local_redis(tmp_path: Path) -> None:
    r = _render(redis_exporter=EXPORTER_IN_CLUSTER)
    jobs = {**JOBS, "count-cache": ["127.0.0.1:7001", "127.0.0.1:7002"]}
    addresses = {AM_IN_CLUSTER: AM_LOCAL, EXPORTER_IN_CLUSTER: "127.0.0.1:9121"}
    cfg, files = transforms.prometheus(r, jobs, addresses, tmp_path / "rules", tmp_path)
    _pods, _sidecars, redis_job = cfg["scrape_configs"]
    assert redis_job["job_name"] == exporters.REDIS_JOB
    # transform 2: the fixed __address__ is the local exporter; nothing else of the job changed
    (fixed,) = [c for c in redis_job["relabel_configs"] if "source_labels" not in c]
    assert fixed == {"target_label": "__address__", "replacement": "127.0.0.1:9121"}
    (rendered_fixed,) = [
        c for c in r.prometheus["scrape_configs"][2]["relabel_configs"] if "source_labels" not in c
    ]
    assert rendered_fixed["replacement"] == EXPORTER_IN_CLUSTER
    # transform 1: each local node is a target carrying the local port in its port annotation
    groups = files[tmp_path / "redis-0.json"]
    port_label = obs.sd_label("annotation", exporters.REDIS_PORT_ANNOTATION)
    by_target = {g["targets"][0]: g["labels"] for g in groups}
    assert by_target["127.0.0.1:7002"][port_label] == "7002"
    assert by_target["127.0.0.1:7001"]["__meta_kubernetes_pod_name"] == "count-cache-local-0"
    # without the exporter in the table the transform refuses, rather than scrape nothing
    with pytest.raises(transforms.TransformError, match="no local server plays"):
        transforms.prometheus(r, jobs, {AM_IN_CLUSTER: AM_LOCAL}, tmp_path, tmp_path)


def _without(cfg: dict[str, Any], *keys: str) -> dict[str, Any]:
    out = copy.deepcopy(cfg)
    for key in keys:
        out.pop(key, None)
    return out


def test_prometheus_changes_only_the_listed_parts(tmp_path: Path) -> None:
    r = _render()
    cfg, files = transforms.prometheus(
        r, JOBS, {AM_IN_CLUSTER: AM_LOCAL}, tmp_path / "rules", tmp_path
    )
    jobs = ("pods", obs.SIDECAR_JOB)
    assert [s["job_name"] for s in cfg["scrape_configs"]] == list(jobs)
    paths = [tmp_path / f"{job}-0.json" for job in jobs]
    assert list(files) == paths and all(len(files[p]) == 3 for p in paths)
    for scrape, rendered_scrape, path in zip(
        cfg["scrape_configs"], r.prometheus["scrape_configs"], paths, strict=True
    ):
        assert "kubernetes_sd_configs" not in scrape
        assert scrape["file_sd_configs"] == [{"files": [str(path)]}]
        assert _without(scrape, "file_sd_configs") == _without(
            rendered_scrape, "kubernetes_sd_configs"
        )
    assert cfg["alerting"]["alertmanagers"][0]["static_configs"] == [{"targets": [AM_LOCAL]}]
    assert cfg["rule_files"] == [str(tmp_path / "rules" / "*.yml")]
    assert "remote_write" not in cfg
    # transform 7: the local intervals, the rest of `global` as rendered
    glob, rendered_glob = cfg["global"], r.prometheus.get("global", {})
    intervals = ("scrape_interval", "evaluation_interval")
    assert {k: glob[k] for k in intervals} == dict.fromkeys(intervals, transforms.LOCAL_INTERVAL)
    assert _without(glob, *intervals) == _without(rendered_glob, *intervals)
    changed = ("scrape_configs", "alerting", "rule_files", "remote_write", "global")
    assert _without(cfg, *changed) == _without(r.prometheus, *changed)  # the rest as rendered
    assert r.prometheus == _render().prometheus  # the render itself is left alone


def test_an_address_without_a_local_server_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(transforms.TransformError, match="no local server plays"):
        transforms.prometheus(_render(), JOBS, {}, tmp_path, tmp_path)


def test_a_discovery_the_transform_cannot_play_is_an_error(tmp_path: Path) -> None:
    r = _render()
    r.prometheus["scrape_configs"][0]["kubernetes_sd_configs"][0]["role"] = "endpoints"
    with pytest.raises(transforms.TransformError, match="cannot play"):
        transforms.prometheus(r, JOBS, {AM_IN_CLUSTER: AM_LOCAL}, tmp_path, tmp_path)


def test_alertmanager_receivers_post_to_the_sink_and_routes_stay() -> None:
    r = _render()
    cfg = transforms.alertmanager(r, "http://127.0.0.1:9095")
    # the routes stay, their timers scaled (transform 6)
    route = cfg["route"]
    assert (route["group_wait"], route["group_interval"], route["repeat_interval"]) == (
        "1s",  # 30s / 60, raised to the 1 s floor
        "5s",
        "240s",
    )
    heartbeat = route["routes"][0]
    assert (heartbeat["group_wait"], heartbeat["group_interval"]) == ("0s", "1s")
    timers = ("group_wait", "group_interval", "repeat_interval")

    def untimed(rt: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in rt.items() if k not in timers}
        if "routes" in rt:
            out["routes"] = [untimed(c) for c in rt["routes"]]
        return out

    assert untimed(route) == untimed(r.alertmanager["route"])
    assert {rc["name"]: rc for rc in cfg["receivers"]} == {
        "heartbeat": {
            "name": "heartbeat",
            "webhook_configs": [{"url": "http://127.0.0.1:9095/heartbeat", "send_resolved": False}],
        },
        "tickets": {
            "name": "tickets",
            "webhook_configs": [{"url": "http://127.0.0.1:9095/tickets"}],
        },
        "pagerduty": {
            "name": "pagerduty",
            "webhook_configs": [{"url": "http://127.0.0.1:9095/pagerduty"}],
        },
        "abuse-team": {
            "name": "abuse-team",
            "webhook_configs": [{"url": "http://127.0.0.1:9095/abuse-team"}],
        },
    }
    # a receiver that sends nothing when rendered sends nothing locally either
    silent = transforms.alertmanager(_render(heartbeat=None), "http://127.0.0.1:9095")
    assert {"name": "heartbeat"} in silent["receivers"]


# --- the webhook sink --------------------------------------------------------------------------


@pytest.fixture
def sink(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    store = tmp_path / "sink" / "n.jsonl"
    server = webhook_sink.ThreadingHTTPServer(
        ("127.0.0.1", 0), webhook_sink.handler(webhook_sink.Store(store))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", store
    server.shutdown()
    server.server_close()


def test_sink_keeps_what_arrived_and_serves_it_back(sink: tuple[str, Path]) -> None:
    url, store = sink
    assert httpx.get(f"{url}/-/ready").status_code == 200
    assert httpx.post(f"{url}/heartbeat", json={"alerts": [{"a": 1}]}).status_code == 200
    assert httpx.post(f"{url}/tickets", json={"alerts": [{"b": 2}]}).status_code == 200
    beats = httpx.get(f"{url}/heartbeat").json()
    assert [(e["receiver"], e["payload"]) for e in beats] == [("heartbeat", {"alerts": [{"a": 1}]})]
    assert [e["receiver"] for e in httpx.get(f"{url}/").json()] == ["heartbeat", "tickets"]
    # JSON lines on disk: a restarted sink still has them
    assert len(webhook_sink.Store(store).read()) == 2
    assert [json.loads(line)["receiver"] for line in store.read_text().splitlines()] == [
        "heartbeat",
        "tickets",
    ]


def test_sink_plays_an_outage_of_one_receiver_until_it_ends(sink: tuple[str, Path]) -> None:
    url, store = sink
    purge = f"{url}/cloudflare/zones/z/purge_cache"
    assert httpx.put(f"{url}/-/outage/cloudflare", json={"status": 503}).status_code == 200
    assert httpx.get(f"{url}/-/outage").json() == {"cloudflare": 503}
    failed = httpx.post(purge, json={"tags": ["a"]})
    assert failed.status_code == 503 and failed.json()["success"] is False
    # the other receivers still answer, and what failed was not stored
    assert httpx.post(f"{url}/tickets", json={"alerts": []}).status_code == 200
    assert [e["receiver"] for e in webhook_sink.Store(store).read()] == ["tickets"]
    assert httpx.delete(f"{url}/-/outage/cloudflare").json() == {
        "receiver": "cloudflare",
        "ended": True,
    }
    assert httpx.post(purge, json={"tags": ["b"]}).json()["success"] is True
    assert [e["payload"] for e in httpx.get(f"{url}/cloudflare").json()] == [{"tags": ["b"]}]
    # an outage needs an error status and a receiver
    assert httpx.put(f"{url}/-/outage/cloudflare", json={"status": 200}).status_code == 400
    assert httpx.put(f"{url}/-/outage/", json={"status": 503}).status_code == 400
    assert httpx.get(f"{url}/-/outage").json() == {}


def test_sink_refuses_what_it_cannot_store(sink: tuple[str, Path]) -> None:
    url, _ = sink
    assert httpx.post(f"{url}/x", content=b"{not json").status_code == 400
    assert httpx.post(f"{url}/", json={}).status_code == 400
    assert httpx.get(f"{url}/").json() == []


# --- the render cache --------------------------------------------------------------------------


def test_the_render_fingerprint_follows_every_source_file(tmp_path: Path) -> None:
    for top in rendered.SOURCES:
        if "." in top:
            (tmp_path / top).write_text("name: likes\n")
            continue
        (tmp_path / top).mkdir(parents=True)
        (tmp_path / top / "a.py").write_text("x = 1\n")
    first = rendered._fingerprint("staging", tmp_path)
    assert rendered._fingerprint("prod-us", tmp_path) != first
    (tmp_path / "stacks" / "a.py").write_text("x = 2\n")
    assert rendered._fingerprint("staging", tmp_path) != first
    (tmp_path / "stacks" / "a.py").write_text("x = 1\n")
    (tmp_path / "infra" / "__pycache__").mkdir()
    (tmp_path / "infra" / "__pycache__" / "a.pyc").write_bytes(b"\0")
    assert rendered._fingerprint("staging", tmp_path) == first  # bytecode is not a source


def test_render_plans_once_per_source_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from infra import config, plan

    plans: list[str] = []
    state = {"hash": "aaa"}

    class Planned:
        ok, violations, resources = True, [], []

    monkeypatch.setattr(rendered, "CACHE_DIR", tmp_path)
    monkeypatch.setattr(rendered, "_fingerprint", lambda stack: state["hash"])
    monkeypatch.setattr(plan, "run", lambda stack: plans.append(stack) or Planned())
    monkeypatch.setattr(config, "parse", lambda *_: None)
    render = rendered.render.__wrapped__  # past the per-process memo: the disk cache's behaviour
    first = render("staging")
    assert render("staging") == first and plans == ["staging"]
    state["hash"] = "bbb"
    assert render("staging") == first and plans == ["staging", "staging"]
    assert [p.name for p in tmp_path.iterdir()] == ["staging-bbb.json"]


# --- transform 6: the time scale -----------------------------------------------------------


def test_durations_are_divided_by_the_time_scale_within_their_floors() -> None:
    assert transforms.TIME_SCALE == 60
    assert transforms.seconds("1h30m") == 5400
    assert transforms.seconds("500ms") == 0.5
    assert transforms.scaled("1h") == "60s"
    assert transforms.scaled("5m", floor_s=0.001) == "5s"
    assert transforms.scaled("30s", floor_s=0.001) == "500ms"
    assert transforms.scaled("30s") == "1s"
    assert transforms.scaled("0s") == "0s"
    with pytest.raises(transforms.TransformError, match="not a Prometheus duration"):
        transforms.seconds("5 minutes")


def test_rules_scale_every_for_and_range_and_nothing_else() -> None:
    text = """groups:
- name: g
  rules:
  - record: r:5m
    expr: sum(rate(x_total{le="0.1"}[5m])) / avg_over_time(b[3d]) + max_over_time(c[1h:1m])
  - alert: A
    expr: sum(increase(y_total[1d])) > 1000 and z offset 5m
    for: 15m
    labels: {window: 1h}
"""
    prom = {"global": {"scrape_interval": "15s", "evaluation_interval": "15s"}}
    out = yaml.safe_load(transforms.rules(text, prom))["groups"][0]["rules"]
    # a 5 m range would be 5 s: raised to 4 local scrapes (transform 7: 4 x 5 s); 3 d is 72 min;
    # the 1 m step of the subquery would be 1 s: raised to the 5 s local evaluation interval
    assert transforms.LOCAL_INTERVAL == "5s"
    assert out[0] == {
        "record": "r:5m",
        "expr": 'sum(rate(x_total{le="0.1"}[20s])) / avg_over_time(b[4320s])'
        " + max_over_time(c[60s:5s])",
    }
    # `offset` is not a range (left as rendered); names and labels keep their words
    assert out[1] == {
        "alert": "A",
        "expr": "sum(increase(y_total[1440s])) > 1000 and z offset 5m",
        "for": "15s",
        "labels": {"window": "1h"},
    }


def test_the_programs_rules_scale_to_minutes() -> None:
    """Every rule of the committed rules file survives the transform, each range at least the
    floor and each `for` 1/60 of its rendered one."""
    from infra import alert_rules

    text = alert_rules.render(alert_rules.rule_groups(alert_rules.default_slos()))
    prom = {"global": {"scrape_interval": "15s", "evaluation_interval": "15s"}}
    before = [r for g in yaml.safe_load(text)["groups"] for r in g["rules"]]
    after = [r for g in yaml.safe_load(transforms.rules(text, prom))["groups"] for r in g["rules"]]
    assert len(before) == len(after)
    for b, a in zip(before, after, strict=True):
        if "for" in b:
            assert transforms.seconds(a["for"]) * 60 == transforms.seconds(b["for"])
        for rng in re.findall(r"\[([0-9a-z]+)[\]:]", a["expr"]):
            assert transforms.seconds(rng) >= 20, (a, rng)


def test_the_canary_drift_ratio_keeps_two_judged_turns_in_its_local_window() -> None:
    """The canary judges one turn per convergence hold (28 s): its 15 m ratio scaled to the
    20 s floor held no turn half the time, and CanaryDrift resolved in the middle of a drift.
    Locally the ratio's ranges hold two holds; the error ratio (errors repeat every 2 s) and
    every other rule keep the scrape floor."""
    from infra import alert_rules
    from services.contracts import convergence
    from services.contracts import metrics as metric_names

    text = alert_rules.render(alert_rules.rule_groups(alert_rules.default_slos()))
    prom = {"global": {"scrape_interval": "15s", "evaluation_interval": "15s"}}
    after = [r for g in yaml.safe_load(transforms.rules(text, prom))["groups"] for r in g["rules"]]
    (drift,) = [r for r in after if r.get("record") == metric_names.CANARY_DRIFT_RATIO]
    ranges = re.findall(r"\[([0-9a-z]+)\]", drift["expr"])
    assert len(ranges) == 2, drift
    assert all(transforms.seconds(r) >= 2 * convergence.HOLD_S for r in ranges), drift
    failing = [r for r in after if r.get("alert") == alert_rules.CANARY_FAILING]
    ranges = [x for r in failing for x in re.findall(r"\[([0-9a-z]+)\]", r["expr"])]
    assert ranges == ["20s", "20s"], failing


def test_a_sidecars_named_port_is_a_target_of_its_workloads_pod() -> None:
    """The scorer's pod declares its sidecar's ops port by name: the local model server's
    target is that port of the scorer's local pod (the pod's annotations keep the scorer's own
    port, so the pods job rewrites it to the scorer, one target), and the pod-sidecars job
    keeps it, labelled with the container's name."""
    from services.contracts import workloads

    scorer = Pod(
        "likes",
        {obs.NAME_LABEL: "abuse-scorer"},
        {**SCRAPED, "prometheus.io/port": "9100"},
        {"abuse-scorer": {"metrics": 9100},
         "abuse-model": {"grpc": 50051, workloads.SIDECAR_METRICS_PORT: 9101}},
    )  # fmt: skip
    r = _render()
    r = Rendered(r.prometheus, r.rules, r.alertmanager, [*r.pods, scorer])
    jobs = {
        "abuse-scorer": ["127.0.0.1:8900"],
        transforms.port_key("abuse-scorer", workloads.SIDECAR_METRICS_PORT): ["127.0.0.1:8902"],
    }
    by_target = {g["targets"][0]: g["labels"] for g in transforms.file_sd_groups(r, jobs, None)}
    model = by_target["127.0.0.1:8902"]
    assert model["__meta_kubernetes_pod_name"] == by_target["127.0.0.1:8900"][
        "__meta_kubernetes_pod_name"
    ]  # fmt: skip
    assert model["__meta_kubernetes_pod_annotation_prometheus_io_port"] == "8900"
    assert model["__meta_kubernetes_pod_container_name"] == "abuse-model"
    assert model["__meta_kubernetes_pod_container_port_name"] == workloads.SIDECAR_METRICS_PORT
    (job,) = [j for j in r.prometheus["scrape_configs"] if j["job_name"] == obs.SIDECAR_JOB]
    keep, *labels = job["relabel_configs"]
    assert re.fullmatch(keep["regex"], model[keep["source_labels"][0]])
    assert {"source_labels": ["__meta_kubernetes_pod_container_name"],
            "target_label": "workload"} in labels  # fmt: skip
    # a port the pod does not declare is an error, not a silent skip
    with pytest.raises(transforms.TransformError, match="declares no container port"):
        transforms.file_sd_groups(r, {"abuse-scorer/nope": ["127.0.0.1:1"]}, None)
