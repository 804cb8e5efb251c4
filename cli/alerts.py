"""`likes alerts [--json] [--since 1h]`: what is firing now, and what resolved lately.

Firing alerts come from Alertmanager's API (`/api/v2/alerts`: active, silenced or inhibited).
Resolved ones come from what Alertmanager delivered: locally, the webhook sink that keeps every
notification (local/webhook_sink.py). Without a sink (`--sink ''`, a deployed environment whose
receivers are PagerDuty and a ticket webhook) only firing alerts are listed.

Addresses default to the local stack named by LIKES_HOME / LIKES_PORT_OFFSET; `--alertmanager`
points at another (a port-forward to the cluster's).
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.table import Table

console = Console()
err = Console(stderr=True)

_STATE_STYLE = {"firing": "bold red", "suppressed": "yellow", "resolved": "green"}


def _local_urls() -> tuple[str, str]:
    from local import layout

    lay = layout.from_env()
    host = layout.HOST
    return (
        f"http://{host}:{lay.ports.alertmanager}",
        f"http://{host}:{lay.ports.webhook_sink}",
    )


def _ts(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _entry(alert: dict[str, Any], state: str) -> dict[str, Any]:
    labels = dict(alert.get("labels") or {})
    annotations = alert.get("annotations") or {}
    ended = alert.get("endsAt") if state == "resolved" else None
    return {
        "name": labels.get("alertname", ""),
        "state": state,
        "labels": labels,
        "started_at": alert.get("startsAt"),
        "ended_at": ended,
        "summary": annotations.get("summary", ""),
        "runbook_url": annotations.get("runbook_url", ""),
        "fingerprint": alert.get("fingerprint", ""),
    }


def firing(alertmanager: str) -> list[dict[str, Any]]:
    """Alertmanager's current alerts: `firing`, or `suppressed` (silenced or inhibited)."""
    resp = httpx.get(f"{alertmanager}/api/v2/alerts", timeout=10)
    resp.raise_for_status()
    out = []
    for a in resp.json():
        state = "firing" if (a.get("status") or {}).get("state") == "active" else "suppressed"
        out.append(_entry(a, state))
    return out


def resolved(sink: str, since_s: float, now: float, current: set[str]) -> list[dict[str, Any]]:
    """Alerts whose last delivered notification says resolved, resolved within `since_s`, and
    not firing again now (`current`: the fingerprints Alertmanager holds)."""
    resp = httpx.get(sink, timeout=10)
    resp.raise_for_status()
    last: dict[str, dict[str, Any]] = {}
    for note in resp.json():
        payload = note.get("payload")
        if not isinstance(payload, dict):
            continue  # the sink also keeps other stand-ins' calls (the CDN purges)
        for a in payload.get("alerts") or []:
            key = a.get("fingerprint") or json.dumps(a.get("labels"), sort_keys=True)
            last[key] = a  # the sink keeps arrival order: the last word wins
    out = []
    for key, a in last.items():
        if a.get("status") != "resolved" or key in current:
            continue
        if now - _ts(a["endsAt"]) <= since_s:
            out.append(_entry(a, "resolved"))
    return out


def listing(alertmanager: str, sink: str, since_s: float) -> list[dict[str, Any]]:
    """What `likes alerts --json` prints: the firing alerts, newest first, then those resolved
    within `since_s` (none without a `sink`), newest first. httpx.HTTPError when either source
    cannot be read."""
    now_firing = firing(alertmanager)
    current = {a["fingerprint"] for a in now_firing}
    done = resolved(sink, since_s, time.time(), current) if sink else []
    rows = sorted(now_firing, key=lambda a: a["started_at"] or "", reverse=True)
    return rows + sorted(done, key=lambda a: a["ended_at"] or "", reverse=True)


def _parse_since(value: str) -> float:
    from local import observability_transforms

    try:
        return observability_transforms.seconds(value)
    except observability_transforms.TransformError:
        raise typer.BadParameter(f"{value!r} is not a duration like 30m, 1h or 2d") from None


def alerts(
    as_json: Annotated[bool, typer.Option("--json", help="A JSON list of alerts.")] = False,
    since: Annotated[
        str, typer.Option(help="How far back resolved alerts are listed (30m, 1h, 2d).")
    ] = "1h",
    alertmanager: Annotated[
        str | None, typer.Option(help="Alertmanager's URL (default: the local stack's).")
    ] = None,
    sink: Annotated[
        str | None,
        typer.Option(help="The webhook sink's URL ('' for none; default: the local stack's)."),
    ] = None,
) -> None:
    """List firing alerts and those resolved within --since, newest first, with their runbook.

    --json prints a list of objects with name, state (firing | suppressed | resolved), labels,
    started_at, ended_at, summary, runbook_url and fingerprint."""
    window = _parse_since(since)
    local_am, local_sink = _local_urls()
    am_url = alertmanager or local_am
    sink_url = local_sink if sink is None else sink
    try:
        rows = listing(am_url, sink_url, window)
    except httpx.HTTPError as e:
        err.print(f"[red]cannot read alerts:[/red] {e} (Alertmanager {am_url}, sink {sink_url})")
        raise typer.Exit(2) from None
    if as_json:
        print(json.dumps(rows))
        return
    if not rows:
        console.print(f"no alert firing, none resolved in the last {since}")
        return
    table = Table("state", "alert", "labels", "started", "runbook")
    for a in rows:
        labels = ", ".join(
            f"{k}={v}" for k, v in sorted(a["labels"].items()) if k not in ("alertname",)
        )
        style = _STATE_STYLE.get(a["state"], "")
        table.add_row(f"[{style}]{a['state']}[/]", a["name"], labels, a["started_at"] or "",
                      a["runbook_url"])  # fmt: skip
    console.print(table)


__all__ = ["alerts", "firing", "listing", "resolved"]
