"""The dashboards as the program renders them (under Pulumi's mocks): the seven boards in Grafana's
ConfigMap, every query valid PromQL for the Prometheus the program pins, every panel on the
provisioned datasource, and Grafana mounting both where its provisioning says. That every query
returns data on a running stack is tests/integration/test_dashboards.py."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra import dashboards, observability, plan, platform
from local import observability_render
from tests.infra.conftest import STACKS, named, tool

BOARDS = {"edge", "write", "read", "stream", "hotkeys", "control-plane", "abuse"}


def targets(board: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(p["title"], t) for p in board["panels"] for t in p.get("targets", [])]


def _grafana(p: plan.Plan) -> dict[str, Any]:
    spec: dict[str, Any] = named(p, "Deployment", "grafana").inputs["spec"]["template"]["spec"]
    return spec


@pytest.mark.parametrize("stack", STACKS)
def test_the_seven_boards_are_rendered_into_grafanas_config_map(
    plans: dict[str, plan.Plan], stack: str
) -> None:
    rendered = observability_render.from_plan(plans[stack]).dashboards
    assert {name.removeprefix("likes-").removesuffix(".json") for name in rendered} == BOARDS
    for name, board in rendered.items():
        assert name == f"{board['uid']}.json"
        assert board["editable"] is False  # provisioned from code: the UI cannot drift
        panels = [p for p in board["panels"] if p["type"] != "row"]
        assert panels, name
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids)), f"{name}: panel ids repeat"
        for p in panels:
            assert p["datasource"] == {"type": "prometheus", "uid": dashboards.DATASOURCE_UID}
            assert p["targets"], f"{name}: {p['title']} has no query"
            refs = [t["refId"] for t in p["targets"]]
            assert len(refs) == len(set(refs)), f"{name}: {p['title']}"


def test_every_query_is_valid_promql_for_the_pinned_prometheus(tmp_path: Path) -> None:
    # promtool parses each query as a recording rule's expression: a typo, a bad matcher or a
    # function this Prometheus lacks fails here, not on someone's screen
    rules = []
    for name, text in dashboards.render().items():
        board = yaml.safe_load(text)
        for i, (title, t) in enumerate(targets(board)):
            expr = t["expr"].replace(dashboards.RATE_INTERVAL, "1m")
            assert "$" not in expr, f"{name}: {title}: a Grafana variable the test cannot fill"
            rules.append({"record": f"dashboard:{board['uid'].replace('-', '_')}:{i}",
                          "expr": expr})  # fmt: skip
    path = tmp_path / "dashboards.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    proc = subprocess.run(
        [tool("promtool", "prometheus"), "check", "rules", str(path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{len(rules)} rules found" in proc.stdout


@pytest.mark.parametrize("stack", STACKS)
def test_grafana_mounts_the_dashboards_and_provisioning_where_it_reads_them(
    plans: dict[str, plan.Plan], stack: str
) -> None:
    p = plans[stack]
    spec = _grafana(p)
    (container,) = spec["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["GF_AUTH_DISABLE_LOGIN_FORM"] == "true"  # nobody logs in: no password to leak
    assert env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert env["GF_PATHS_PROVISIONING"] == mounts["provisioning"]
    items = volumes["provisioning"]["configMap"]["items"]
    config = named(p, "ConfigMap", volumes["provisioning"]["configMap"]["name"])
    files = {i["path"]: yaml.safe_load(config.inputs["data"][i["key"]]) for i in items}
    (source,) = files["datasources/prometheus.yaml"]["datasources"]
    assert source["uid"] == dashboards.DATASOURCE_UID and source["type"] == "prometheus"
    prometheus = observability.in_cluster(
        "prometheus", platform.NS_OBSERVABILITY, observability.PROMETHEUS_PORT
    )
    assert source["url"] == f"http://{prometheus}"
    (provider,) = files["dashboards/likes.yaml"]["providers"]
    assert provider["allowUiUpdates"] is False
    # the provider reads the folder the dashboards ConfigMap is mounted at
    assert provider["options"]["path"] == mounts["dashboards"]
    assert volumes["dashboards"]["configMap"]["name"] == dashboards.CONFIG_MAP
    rendered = observability_render.from_plan(p).dashboards
    assert set(named(p, "ConfigMap", dashboards.CONFIG_MAP).inputs["data"]) == set(rendered)
    # the root filesystem is read-only: every path Grafana writes is on its emptyDir volume
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert "emptyDir" in volumes["data"] and mounts["data"] == env["GF_PATHS_DATA"]
    for key in ("GF_PATHS_PLUGINS", "GF_PATHS_LOGS"):
        assert env[key].startswith(mounts["data"] + "/"), key
    assert "emptyDir" in volumes["tmp"] and mounts["tmp"] == "/tmp"
