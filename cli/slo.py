"""`likes slo [--json]`: each SLO's burn rate over the alert windows and the error budget left.

Read from Prometheus: the recording rules `slo:sli_error:ratio_rate<window>` (infra/alert_rules.py,
one series per SLO) give the error ratio per window; the burn rate is that ratio over the SLO's
budget (1 - objective), so 1 spends the budget exactly in the period (SLO_PERIOD, 30 d), and the
page alerts fire at 14.4 (1 h) and 6 (6 h). The budget left is 1 minus the period's error ratio
over the budget, the period's ratio being the mean of the hourly ratios (negative: overspent).

The local stack runs the rules time-scaled (local/observability_transforms.py transform 6): its
period is scaled the same way. `--prometheus URL` reads another Prometheus, unscaled.
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.table import Table

from infra import alert_rules

console = Console()
err = Console(stderr=True)

BURN_WINDOWS = ("5m", "1h", "6h", "3d")  # the windows the alerts pair (WINDOWS minus 30m)


def _local() -> tuple[str, str]:
    from local import layout
    from local import observability_transforms as transforms

    lay = layout.from_env()
    url = f"http://{layout.HOST}:{lay.ports.prometheus}"
    return url, transforms.scaled(alert_rules.SLO_PERIOD)


def _query(prometheus: str, promql: str) -> dict[str, float]:
    """slo label -> value of an instant query (NaN: no traffic in the window)."""
    resp = httpx.get(f"{prometheus}/api/v1/query", params={"query": promql}, timeout=15)
    resp.raise_for_status()
    body = resp.json()
    if body.get("status") != "success":
        raise httpx.HTTPError(f"query failed: {body.get('error')}")
    return {s["metric"].get("slo", ""): float(s["value"][1]) for s in body["data"]["result"]}


def _number(x: float | None) -> float | None:
    return None if x is None or math.isnan(x) or math.isinf(x) else x


def report(prometheus: str, period: str) -> list[dict[str, Any]]:
    """One object per SLO of the program's table."""
    ratios = {w: _query(prometheus, alert_rules.recording_name(w)) for w in BURN_WINDOWS}
    hourly = alert_rules.recording_name("1h")
    over_period = _query(prometheus, f"avg_over_time({hourly}[{period}])")
    out = []
    for slo in alert_rules.default_slos():
        burn = {w: _number(ratios[w].get(slo.name)) for w in BURN_WINDOWS}
        period_ratio = _number(over_period.get(slo.name))
        out.append(
            {
                "slo": slo.name,
                "service": slo.service,
                "objective": slo.objective,
                "burn_rates": {w: None if r is None else r / slo.budget for w, r in burn.items()},
                "period": period,
                "error_ratio": period_ratio,
                "budget_remaining": None if period_ratio is None else 1 - period_ratio / slo.budget,
            }
        )
    return out


def _cell(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def slo(
    as_json: Annotated[
        bool, typer.Option("--json", help="A JSON list, one object per SLO.")
    ] = False,
    prometheus: Annotated[
        str | None, typer.Option(help="Prometheus's URL (default: the local stack's, time-scaled).")
    ] = None,
) -> None:
    """Burn rate of each SLO over 5m, 1h, 6h and 3d, and the error budget left in the period.

    A burn rate of 1 spends the budget in exactly the period; the pages fire above 14.4 (1h
    with 5m) and 6 (6h with 30m). '-' (null in --json): no events in that window yet."""
    if prometheus is None:
        url, period = _local()
    else:
        url, period = prometheus, alert_rules.SLO_PERIOD
    try:
        rows = report(url, period)
    except httpx.HTTPError as e:
        err.print(f"[red]cannot read the SLOs from Prometheus at {url}:[/red] {e}")
        raise typer.Exit(2) from None
    if as_json:
        print(json.dumps(rows))
        return
    table = Table(
        "slo", "objective", *(f"burn {w}" for w in BURN_WINDOWS), f"budget left ({period})"
    )
    for r in rows:
        left = r["budget_remaining"]
        if left is None:
            budget = "-"
        else:
            style = "red" if left < 0 else "yellow" if left < 0.25 else "green"
            budget = f"[{style}]{left * 100:.1f}%[/]"
        burns = (_cell(r["burn_rates"][w], ".2f") for w in BURN_WINDOWS)
        table.add_row(r["slo"], f"{r['objective'] * 100:g}%", *burns, budget)
    console.print(table)


__all__ = ["report", "slo"]
