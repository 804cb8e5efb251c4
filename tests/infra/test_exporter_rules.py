"""MirrorMaker 2's metrics: the program runs the JMX exporter agent in every MirrorMaker 2 pod with
infra/jmx/mirrormaker2.yaml, and those rules, run in the real agent against MBeans shaped like a
Connect worker's, export the series the cross-region replication SLO selects. No region runs
MirrorMaker 2 locally (one region), so this is where the name is proved."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from infra import alert_rules, exporters, kafka, observability, plan
from local import maven
from services.contracts import metrics as metric_names
from services.schema import cql_apply, cql_roles
from tests.infra.conftest import named

FAKE = Path(__file__).resolve().parent / "jmx" / "FakeMirrorMaker.java"
PEERED = ("prod-us", "prod-eu")

SOURCE = "kafka.connect.mirror:type=MirrorSourceConnector,target=us-east-1,topic=eu-west-1.likes.committed,partition=3"  # noqa: E501
TASK = "kafka.connect:type=connector-task-metrics,connector=MirrorSourceConnector,task=0"
PRODUCER = "kafka.producer:type=producer-metrics,client-id=connector-producer-0"  # not listed


@pytest.mark.parametrize("stack", PEERED)
def test_mirror_makers_run_the_jmx_exporter_with_the_repositorys_rules(
    plans: dict[str, plan.Plan], stack: str
) -> None:
    p = plans[stack]
    mirrors = [r for r in p.resources if r.inputs.get("kind") == "KafkaMirrorMaker2"]
    assert mirrors, f"{stack} has peers but no MirrorMaker 2"
    for mm2 in mirrors:
        spec = mm2.inputs["spec"]
        ref = spec["metricsConfig"]
        assert ref["type"] == "jmxPrometheusExporter"
        key = ref["valueFrom"]["configMapKeyRef"]
        config_map = named(p, "ConfigMap", key["name"], mm2.inputs["metadata"]["namespace"])
        assert config_map.inputs["data"][key["key"]] == exporters.MM2_JMX_RULES.read_text()
        meta = spec["template"]["pod"]["metadata"]
        assert meta["annotations"] == observability.scrape_annotations(
            exporters.STRIMZI_METRICS_PORT
        )
        assert meta["labels"][observability.NAME_LABEL] == kafka.MIRROR_MAKER_APP


def test_the_staging_stack_without_peers_renders_no_mirror_rules(
    plans: dict[str, plan.Plan],
) -> None:
    kinds = [(r.inputs.get("kind"), r.name) for r in plans["staging"].resources]
    assert not [k for k in kinds if k[0] == "KafkaMirrorMaker2"]
    assert not [n for _, n in kinds if n.endswith("-mirror-metrics")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def scrape(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Any]]:
    """The agent's /metrics over fake MirrorMaker 2 MBeans, by metric family name."""
    agent = maven.jar_path(exporters.JMX_AGENT)
    assert agent.exists(), f"{agent} is missing: run local/setup.sh (it fetches the agent)"
    javac = shutil.which("javac")
    assert javac, "no javac: the JDK is part of this machine (see README)"
    out = tmp_path_factory.mktemp("fake-mm2")
    subprocess.run([javac, "-d", str(out), str(FAKE)], check=True, capture_output=True)
    port = _free_port()
    beans = [
        f"{SOURCE}|replication-latency-ms-max|61500",
        f"{SOURCE}|replication-latency-ms-avg|800",
        f"{SOURCE}|record-count|42",
        f"{TASK}|status|running",
        f"{PRODUCER}|record-send-total|7",
    ]
    proc = subprocess.Popen(
        ["java", f"-javaagent:{agent}=127.0.0.1:{port}:{exporters.MM2_JMX_RULES}",
         "-cp", str(out), "FakeMirrorMaker", *beans],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            try:
                text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
                if "kafka_connect" in text:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the agent served no kafka_connect series"
            time.sleep(0.3)
    finally:
        if proc.stdin:
            proc.stdin.close()
        proc.wait(timeout=30)
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def test_the_rules_export_the_replication_latency_the_slo_reads(
    scrape: dict[str, list[Any]],
) -> None:
    name = metric_names.MM2_REPLICATION_LATENCY_MAX
    (sample,) = scrape[name]
    assert sample.labels == {
        "target": "us-east-1",
        "topic": "eu-west-1.likes.committed",
        "partition": "3",
    }
    assert sample.value == 61500
    (slo,) = [s for s in alert_rules.default_slos() if s.name == "cross-region-replication"]
    assert any(name in expr for _, expr in slo.inputs)


def test_the_rules_export_task_state_and_skip_what_is_not_listed(
    scrape: dict[str, list[Any]],
) -> None:
    (status,) = scrape["kafka_connect_connector_task_status"]
    assert status.labels["status"] == "running" and status.value == 1
    assert scrape["kafka_connect_mirror_source_connector_record_count"][0].value == 42
    # the producer's bean is outside includeObjectNames: never read, never exported
    assert not [n for n in scrape if n.startswith("kafka_producer")]
    rules = yaml.safe_load(exporters.MM2_JMX_RULES.read_text())
    assert rules["includeObjectNames"] and rules["rules"]


def test_the_cassandra_rules_name_every_mbean_and_every_table_of_the_schema() -> None:
    """No wildcard in includeObjectNames (the JDK walks every MBean of the domain per pattern:
    most of a scrape's CPU), and so the per-table MBeans are spelled out: exactly the tables the
    schema creates, so a new table is not silently left unwatched."""
    names = yaml.safe_load(exporters.CASSANDRA_JMX_RULES.read_text())["includeObjectNames"]
    ks = cql_roles.KEYSPACE
    assert names and not [n for n in names if "*" in n or "?" in n]
    created = {
        m.group(1)
        for stmt in cql_apply.statements({"datacenter1": 1})
        if (m := re.match(rf"CREATE TABLE IF NOT EXISTS {ks}\.(\w+)", stmt.strip()))
    }
    by_metric: dict[str, set[str]] = {}
    for n in names:
        keys = dict(kv.split("=", 1) for kv in n.split(":", 1)[1].split(","))
        if keys.get("type") == "Table":
            assert keys["keyspace"] == ks, n
            by_metric.setdefault(keys["name"], set()).add(keys["scope"])
    assert len(created) >= 5 and by_metric
    for metric, tables in by_metric.items():
        assert tables == created, f"{metric}: {sorted(tables ^ created)}"
