"""The README's demo on the running stack, then every dashboard panel the program renders: each
query of Grafana's ConfigMap, run on the local Prometheus as Grafana would send it, returns data.
A renamed metric, a label no exporter writes or a job the local stack does not scrape shows up
here as the panel that went blank."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from infra import dashboards
from local import observability_render
from tests.conftest import Stack

pytestmark = pytest.mark.stack

# what Grafana puts for $__rate_interval at the local scrape interval (15 s): four scrapes
LOCAL_RATE_INTERVAL = "1m"
DEADLINE_S = 150  # a series a scrape after the demo, a rate() two; the canary's first verdicts


def _queries(stack: Stack) -> list[tuple[str, str, str]]:
    """(board, panel, PromQL) for every target of the rendered dashboards."""
    out = []
    for name, board in observability_render.load(stack.layout.stack).dashboards.items():
        for panel in board["panels"]:
            for target in panel.get("targets", []):
                expr = target["expr"].replace(dashboards.RATE_INTERVAL, LOCAL_RATE_INTERVAL)
                out.append((name, f"{panel['title']} [{target['refId']}]", expr))
    return out


def _series(stack: Stack, expr: str) -> list[Any]:
    r = httpx.get(f"{stack.prometheus_url}/api/v1/query", params={"query": expr}, timeout=10)
    r.raise_for_status()
    result: list[Any] = r.json()["data"]["result"]
    return result


def test_the_demo_converges_and_then_every_dashboard_panel_has_data(stack: Stack) -> None:
    demo = stack.cli("local", "demo", "--json", timeout=180)
    out = json.loads(demo.stdout.splitlines()[-1])
    assert out["converged"] is True, out
    assert {p: c["count"] for p, c in out["counts"].items()} == out["expected"]

    queries = _queries(stack)
    assert len({board for board, _, _ in queries}) == len(dashboards.BOARDS)
    blank = {(board, panel): expr for board, panel, expr in queries}
    deadline = time.monotonic() + DEADLINE_S
    while blank and time.monotonic() < deadline:
        blank = {key: expr for key, expr in blank.items() if not _series(stack, expr)}
        if blank:
            time.sleep(5)
    assert not blank, "panels without data after the demo:\n" + "\n".join(
        f"  {board}: {panel}: {expr}" for (board, panel), expr in sorted(blank.items())
    )
